"""Run one job directory through Flower's simulation runtime (a child process of popri score).

    python -m popri.federated.flower.simulate runs/x/scores.flower-job

The engine (:mod:`popri.federated.flower.engine`) writes the job and starts this module in its
own process group (so a timeout or Ctrl-C ends Ray's workers too); it runs
``flwr.simulation.run_simulation`` with :mod:`~popri.apps.flower.server_app` and
:mod:`~popri.apps.flower.client_app` on ``settings["secagg"]["nodes"]`` virtual SuperNodes
(Ray backend, one CPU per client worker, at most ``--threads`` workers at once), and exits 0
when the ServerApp wrote ``result.json``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from popri.core import io
from popri.federated.flower import CLIENT_APP, SERVER_APP, load_app


def _die_with_parent(job: Path) -> None:
    """A SIGKILLed popri cannot clean up, and this process (a session of its own, so that popri
    can kill the whole Flower/Ray group) would run on, writing the clients' data into ``job``.
    A watchdog thread notices the parent's death (we are re-parented), removes ``job`` and
    kills this process group (the simulation and its Ray workers)."""
    import shutil
    import signal
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                shutil.rmtree(job, ignore_errors=True)
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="popri-parent-watchdog", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m popri.federated.flower.simulate JOB_DIR", file=sys.stderr)
        return 2
    job = Path(argv[0]).resolve()
    _die_with_parent(job)
    os.environ["POPRI_FLOWER_JOB"] = str(job)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    settings = io.read_json(job / "settings.json", expect=dict)
    workers = max(1, int(settings.get("workers") or os.cpu_count() or 1))
    from flwr.simulation import run_simulation

    run_simulation(
        server_app=load_app(SERVER_APP), client_app=load_app(CLIENT_APP),
        num_supernodes=int(settings["secagg"]["nodes"]),
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                        "init_args": {"num_cpus": workers, "include_dashboard": False,
                                      "log_to_driver": True}})
    return 0 if (job / "result.json").is_file() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
