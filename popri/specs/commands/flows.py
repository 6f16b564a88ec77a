"""Each command's privacy provenance flow (issue 66): which inputs its outputs derive from and
what its DP mechanism guarantees, one :class:`~popri.core.provenance.Flow` per command.

    python -c "from popri.specs.commands.flows import FLOWS; print(sorted(FLOWS))"
    python -m pytest -q tests/test_provenance.py     # every command x input status

The rules are in :mod:`popri.core.provenance`; :func:`popri.cli.options.command` applies them
around every command that has a flow here (``FLOWS[call.command]``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from popri.core.provenance import PUBLIC, Flow, Provenance, dp, not_dp, private


def _convention(call: Any, what: str) -> Provenance | None:
    conv = getattr(call, "convention", None)
    if conv:
        return not_dp(f"{what}: accounted under the {conv!r} convention, which is not a DP "
                      "guarantee")
    return None


def _zero(call: Any, what: str) -> Provenance | None:
    if getattr(call, "noise_multiplier", None) == 0:
        return not_dp(f"{what}: z = 0, no noise (epsilon = inf)")
    return None


def score_mechanism(call: Any) -> Provenance:
    """``popri score``: the noisy sum is DP unless it is a diagnostic, noise-free or accounted
    under a convention."""
    what = f"{call.out or 'popri score'}"
    if getattr(call, "diagnostic", False):
        return not_dp(f"{what}: noise-free scores ('popri score --diagnostic')")
    return _zero(call, what) or _convention(call, what) or dp()


def upload_mechanism(call: Any) -> Provenance:
    """``popri aggregate``: what the uploads' mechanism was (their sidecar's parameters)."""
    what = f"{call.out or 'popri aggregate'}"
    for f in call.files or ():
        side = Path(str(f)).with_suffix(".json")
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        params = meta.get("params") or {}
        if meta.get("diagnostic"):
            return not_dp(f"{what}: sums noise-free uploads ({side} says diagnostic)")
        if params.get("noise_multiplier") == 0:
            return not_dp(f"{what}: sums uploads made at z = 0 (epsilon = inf)")
        if params.get("convention"):
            return not_dp(f"{what}: uploads accounted under the {params['convention']!r} "
                          "convention, which is not a DP guarantee")
    return dp()


def fred_mechanism(call: Any) -> Provenance:
    what = f"{call.out}"
    if getattr(call, "non_private", False):
        return not_dp(f"{what}: exact statistics ('popri fred stats --non-private')")
    return _zero(call, what) or dp()


def fl_mechanism(call: Any) -> Provenance:
    """``popri fl round``: the noised model.  round.json's ``private_diagnostics`` (research
    mode, or ``--diagnostics``) is labelled NOT PRIVATE in the file itself and is no part of
    the model a later stage reads."""
    what = f"{call.out}"
    return _zero(call, what) or _convention(call, what) or dp()


def fewfedpit_mechanism(call: Any) -> Provenance:
    """``popri fewfedpit aggregate``: DP only with noise (FewFedPIT itself adds none)."""
    what = f"{call.out}"
    if not getattr(call, "noise_multiplier", 0):
        return not_dp(f"{what}: aggregated without noise (z = 0: no DP claim)")
    return dp()


def research_read(command: str):
    """An evaluation that reads client data as given (a research read, never a release)."""
    def mech(call: Any) -> Provenance:
        return not_dp(f"'popri {command}' reads client data exactly (a research read)")
    return mech


def fetched(call: Any) -> Provenance:
    """``bench fetch`` / ``instruct build``: the clients' private data unless ``--public``."""
    if getattr(call, "public", False):
        return PUBLIC
    return private(f"{call.out}: client data fetched by 'popri {call.command}'")


def reported(call: Any) -> Provenance:
    """``popri report``: a report of research runs shows their research reads (the private
    diagnostics, the evaluation on the private test split): not-dp; one of release runs holds
    only what they released (its status)."""
    links, entries = [], []
    for d in call.run_dirs or ():
        try:
            r = json.loads((Path(str(d)) / "results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict):
            continue
        reads = r.get("research_reads") or []
        if r.get("mode") != "release" and reads:
            links.append(f"{d}: research reads of the private splits ({'; '.join(reads)})")
        rp = r.get("release_provenance")
        if isinstance(rp, dict):
            if rp.get("dp_guarantee") is False:
                links += [f"{d}: {x}" for x in rp.get("links") or ()]
            entries += list(rp.get("entries") or ())
    if links:
        return not_dp(*links)
    return dp(entries) if entries else PUBLIC


ALL = None
FLOWS: dict[str, Flow] = {
    # data
    "bench fetch": Flow(outputs={"out": ()}, source=fetched),
    "instruct build": Flow(outputs={"out": ()}, source=fetched),
    "embed": Flow(inputs={"input": "transform"}, outputs={"out": ALL}),
    "take": Flow(inputs={"samples": "data", "tokens_of": "data", "mix_from": "data"},
                 outputs={"out": ALL, "stats_out": ALL}),
    # the server's generator
    "gen": Flow(inputs={"omega": "data", "prompts": "data", "adapter": "data"},
                outputs={"out": ALL, "prompts_out": ALL, "stats_out": ALL}),
    "vary": Flow(inputs={"input": "data", "adapter": "data"},
                 outputs={"out": ALL, "lookahead_out": ALL, "stats_out": ALL}),
    "expand": Flow(inputs={"seeds": "data", "adapter": "data"},
                   outputs={"out": ALL, "merged_out": ALL}),
    # DP mechanisms
    "score": Flow(inputs={"private": "private", "synthetic": "data"},
                  outputs={"out": ALL, "per_client_out": ALL}, mechanism=score_mechanism,
                  private_out=("per_client_out",)),
    "aggregate": Flow(inputs={"files": "private"}, outputs={"out": ALL},
                      mechanism=upload_mechanism),
    "fred stats": Flow(inputs={"private": "private"}, outputs={"out": ALL},
                       mechanism=fred_mechanism),
    "fl round": Flow(inputs={"data": "private", "init": "data", "model": "data"},
                     outputs={"out": ALL}, mechanism=fl_mechanism),
    "fewfedpit aggregate": Flow(inputs={"uploads": "private", "init": "data"},
                                outputs={"out": ALL}, mechanism=fewfedpit_mechanism),
    # per-client steps of FewFedPIT: their outputs stay on the client
    "fewfedpit local": Flow(inputs={"data": "transform", "init": "data"},
                            outputs={"out": ALL}),
    "fewfedpit selfgen": Flow(inputs={"data": "transform", "init": "data", "local": "transform",
                                      "instruction_prompts": "data"},
                              outputs={"out": ALL, "stats_out": ALL}),
    "fewfedpit train": Flow(inputs={"synthetic": "transform", "data": "transform",
                                    "init": "data"}, outputs={"out": ALL}),
    "fewfedpit mix": Flow(inputs={"local": "transform", "public": "data", "init": "data"},
                          outputs={"out": ALL}),
    "fewfedpit init": Flow(inputs={"model": "data"}, outputs={"out": ALL}),
    # preference data and tuning (post-processing of the released scores)
    "prefs build": Flow(inputs={"samples": "data", "scores": "data", "true_scores": "data",
                                "fluency": "data", "embeddings": "data"},
                        outputs={"out": ("samples", "scores", "fluency", "embeddings"),
                                 "report_out": ALL}),
    "prefs gate": Flow(inputs={"samples": "data", "fluency": "data"}, outputs={"out": ALL}),
    "prefs pool": Flow(inputs={"samples": "data", "scores": "data", "base": "data"},
                       outputs={"out": ALL}),
    "dpo": Flow(inputs={"pairs": "data", "model": "data", "adapter": "data",
                        "eval_pairs": "data", "select_on": "data", "select_prompts": "data"},
                outputs={"out": ALL}),
    "sft": Flow(inputs={"pairs": "data", "samples": "data", "scores": "data", "model": "data",
                        "adapter": "data"}, outputs={"out": ALL}),
    "pe draw": Flow(inputs={"population": "data", "scores": "data"},
                    outputs={"out": ALL, "stats_out": ALL}),
    "pe init": Flow(inputs={"public": "data"}, outputs={"out": ALL}),
    "pe seeds": Flow(inputs={"survivors": "data"}, outputs={"out": ALL}),
    # the downstream model and evaluation
    "train-downstream": Flow(inputs={"train": "data", "val": "data", "model": "data"},
                             outputs={"out": ALL}),
    "eval accuracy": Flow(inputs={"model": "data", "adapter": "data", "data": "data"},
                          outputs={"per_client_out": ALL}),
    "eval instruct": Flow(inputs={"model": "data", "data": "data"},
                          outputs={"per_client_out": ALL}),
    "eval fluency": Flow(inputs={"samples": "data", "model": "data", "adapter": "data"},
                         outputs={"out": ALL}),
    "report": Flow(outputs={"out": ()}, source=reported),
    "audit extract": Flow(inputs={"model": "data", "data": "private"}, outputs={"out": ALL},
                          mechanism=research_read("audit extract")),
}
