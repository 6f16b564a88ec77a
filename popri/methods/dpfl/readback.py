"""DP-FL's rounds read back for ``popri report`` (:meth:`DPFL.round_panels`): the clients' local
loss, update norms against the clip and the share clipped, per round, from
``fl/roundT/round.json``'s private diagnostics (else results.json's ``fl.rounds``).

    python -m pytest -q tests/test_report.py -k fl
"""

from __future__ import annotations

from pathlib import Path

from popri.core.io import read_json_lenient
from popri.core.readback import as_dict, num, round_dirs
from popri.methods.base import RoundPanels


def fl_rounds(run_dir: Path, results: dict | None) -> list[dict]:
    """One row per round: its private diagnostics and the clip."""
    rows = []
    for t, R in round_dirs(run_dir / "fl"):
        d = read_json_lenient(R / "round.json")
        if isinstance(d, dict):
            pd = as_dict(d.get("private_diagnostics"))
            rows.append({"round": t, **{k: pd.get(k) for k in (
                "local_loss", "update_norm_mean", "update_norm_max", "clipped_share",
                "participants")},
                "clip": as_dict(d.get("spec")).get("clip")})
    fl = as_dict((results or {}).get("fl"))
    if not rows and isinstance(fl.get("rounds"), list):
        for r in fl["rounds"]:
            if isinstance(r, dict) and num(r.get("round")) is not None:
                rows.append({"round": r["round"], **as_dict(r.get("private_diagnostics")),
                             "clip": fl.get("clip")})
    return rows


def round_panels(run_dir: Path, results: dict | None) -> RoundPanels | None:
    rows = fl_rounds(run_dir, results)
    if not rows:
        return None
    clip = next((c for r in rows if (c := num(r.get("clip"))) is not None), None)
    return RoundPanels(rows, [
        {"title": "Clients' local training loss", "ylabel": "mean local loss",
         "lines": [("local_loss", None, "local loss", "participants", "clients")]},
        {"title": "Client update norms", "ylabel": "L2 norm of the update",
         "lines": [("update_norm_mean", None, "mean", "participants", "clients"),
                   ("update_norm_max", None, "max")],
         "hline": (clip, f"clip = {clip:g}") if clip is not None else None},
        {"title": "Share of updates clipped", "ylabel": "clipped share",
         "lines": [("clipped_share", None, "clipped share", "participants", "clients")],
         "ylim": (-0.02, 1.05)},
    ], name="fl-rounds", title="DP-FL rounds",
        caption="clients' local loss, update norms (against the clip) and the share clipped, "
                "per round (fl/roundT/round.json private_diagnostics: never publish); n: "
                "clients.",
        suptitle="DP-FL rounds (private diagnostics: exact client statistics, never publish)")


__all__ = ["fl_rounds", "round_panels"]
