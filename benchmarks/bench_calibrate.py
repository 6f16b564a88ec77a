"""Benchmark the noise calibration of `popri run`'s plan with and without its memo, in one process.

    python benchmarks/bench_calibrate.py            # the shipped configs' shapes, 3 repeats each

Each case is a calibration `popri run` makes when it plans (popri.pipeline.budget.Budget:
privacy.epsilon at privacy.delta over T Poisson-subsampled rounds, opacus RDP): (a) the search
(popri.privacy.calibration.calibrate without a memo: bracket and bisection, ~20 compositions)
and (b) the same call answered from a memo holding (a)'s z, which calibrate checks again (epsilon
at z and at z - tol: two compositions) before using it.  Reported: median seconds of each and
(a) / (b); the two z must be equal.  Results: a table on stdout and
benchmarks/results/calibrate.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from popri.privacy import accounting as A
from popri.privacy import calibration as C

# (label, eps, delta, q, rounds): examples/default.yaml (T = 1) and examples/learning.yaml-like
# (T = 3), both at q = 0.5; a small-q run (q = 0.05, T = 10)
CASES = [("default: eps 1, q 0.5, T 1", 1.0, 3e-6, 0.5, 1),
         ("learning: eps 1, q 0.5, T 3", 1.0, 3e-6, 0.5, 3),
         ("small q: eps 1, q 0.05, T 10", 1.0, 1e-5, 0.05, 10)]


class DictMemo:
    def __init__(self):
        self.d = {}

    def get(self, key):
        return self.d.get(key)

    def put(self, key, z):
        self.d[key] = z


def timed(fn, repeats: int) -> tuple[float, float]:
    times, z = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        z = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), z


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "calibrate.json"))
    a = ap.parse_args(argv)
    rows = []
    print(f"{'case':32} {'search s':>9} {'memo s':>8} {'ratio':>7}", file=sys.stderr)
    for label, eps, delta, q, rounds in CASES:
        def f(z, q=q, rounds=rounds):
            return A.history_of(z, q, rounds)

        memo = DictMemo()
        C.calibrate(eps, delta, f, "rdp", memo=memo)  # fills the memo
        search, z0 = timed(lambda: C.calibrate(eps, delta, f, "rdp"), a.repeats)
        kept, z1 = timed(lambda: C.calibrate(eps, delta, f, "rdp", memo=memo), a.repeats)
        assert z0 == z1, (label, z0, z1)
        rows.append({"case": label, "z": z0, "search_s": search, "memo_s": kept,
                     "ratio": search / kept})
        print(f"{label:32} {search:9.2f} {kept:8.2f} {search / kept:7.1f}", file=sys.stderr)
    out = {"machine": platform.machine(), "python": platform.python_version(),
           "repeats": a.repeats, "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
