"""The settings of every step, one frozen spec dataclass each (help, paper source and valid range
in the field metadata; :mod:`popri.core.spec`).  Each default is written once, here; the
commands' options, ``popri run``'s config sections and the stage command lines are derived.

    from popri.specs import DPOSpec
    DPOSpec(beta=0.1, lora_r=8)

Pure Python (no torch / numpy): importing the specs is cheap.
"""

from popri.specs.data import (  # noqa: F401
    EmbedSpec,
    FetchSpec,
)
from popri.specs.feedback import (  # noqa: F401
    AggregateSpec,
    ScoreSpec,
    ThresholdSpec,
)
from popri.specs.generation import (  # noqa: F401
    ExpandSpec,
    FilterSpec,
    GeneratorSpec,
    GenSpec,
    SamplingSpec,
    VarySpec,
)
from popri.specs.privacy import (  # noqa: F401
    AccountantSpec,
    AuditSpec,
    EpsilonSpec,
    FredDesignSpec,
    FredStatsSpec,
    GaussianCalibrationSpec,
    LedgerTotalSpec,
    ReleaseModeSpec,
    ReleasesSpec,
    SigmaSpec,
    TargetDeltaSpec,
)
from popri.specs.training import (  # noqa: F401
    BootstrapSpec,
    DownstreamSpec,
    DPOSpec,
    EvalSpec,
    GapSpec,
    LoraSpec,
    PrecisionSpec,
    PrefsSpec,
    SelectSpec,
    SequenceSpec,
    SFTSpec,
    TrainSpec,
)

__all__ = [
    "FetchSpec",
    "EmbedSpec",
    "ThresholdSpec",
    "ScoreSpec",
    "AggregateSpec",
    "SamplingSpec",
    "FilterSpec",
    "GeneratorSpec",
    "GenSpec",
    "VarySpec",
    "ExpandSpec",
    "AccountantSpec",
    "TargetDeltaSpec",
    "ReleasesSpec",
    "EpsilonSpec",
    "SigmaSpec",
    "LedgerTotalSpec",
    "ReleaseModeSpec",
    "FredDesignSpec",
    "GaussianCalibrationSpec",
    "FredStatsSpec",
    "AuditSpec",
    "LoraSpec",
    "PrecisionSpec",
    "TrainSpec",
    "SequenceSpec",
    "BootstrapSpec",
    "PrefsSpec",
    "DPOSpec",
    "SFTSpec",
    "SelectSpec",
    "DownstreamSpec",
    "EvalSpec",
    "GapSpec",
]
