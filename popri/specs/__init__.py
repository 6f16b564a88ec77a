"""The settings of every step, one frozen spec dataclass each (help, paper source and valid range
in the field metadata; :mod:`popri.core.spec`).  Each default is written once, here; the
commands' options, ``popri run``'s config sections and the stage command lines are derived.

    from popri.specs import DPOSpec
    DPOSpec(beta=0.1, lora_r=8)

Pure Python (no torch / numpy): importing the specs is cheap.
"""

from popri.specs.data import (  # noqa: F401
    FetchSpec,
    EmbedSpec,
)
from popri.specs.feedback import (  # noqa: F401
    ThresholdSpec,
    ScoreSpec,
    AggregateSpec,
)
from popri.specs.generation import (  # noqa: F401
    SamplingSpec,
    FilterSpec,
    GeneratorSpec,
    GenSpec,
    VarySpec,
    ExpandSpec,
)
from popri.specs.privacy import (  # noqa: F401
    AccountantSpec,
    TargetDeltaSpec,
    ReleasesSpec,
    EpsilonSpec,
    SigmaSpec,
    LedgerTotalSpec,
    ReleaseModeSpec,
    FredDesignSpec,
    GaussianCalibrationSpec,
    FredStatsSpec,
    AuditSpec,
)
from popri.specs.training import (  # noqa: F401
    LoraSpec,
    PrecisionSpec,
    TrainSpec,
    SequenceSpec,
    BootstrapSpec,
    PrefsSpec,
    DPOSpec,
    SFTSpec,
    SelectSpec,
    DownstreamSpec,
    EvalSpec,
    GapSpec,
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
