"""Where a test run's time went, per worker: the timeline POPRI_TEST_TIMES=DIR records
(tests/conftest.py), read back.

    POPRI_TEST_TIMES=/tmp/tt bash scripts/test.sh && python scripts/test_timeline.py /tmp/tt

Prints each worker's busy seconds and end, the idle tail (the last worker's end minus the
first's: what an even split would save), the slowest tests and the tests each worker ran last.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def load(d: Path) -> list[dict]:
    rows = []
    for f in sorted(d.glob("*.jsonl")):
        rows += [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    return rows


def main() -> int:
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_dir():
        print("usage: python scripts/test_timeline.py DIR [N]", file=sys.stderr)
        return 2
    rows = load(Path(sys.argv[1]))
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    if not rows:
        print(f"test_timeline: no records under {sys.argv[1]}", file=sys.stderr)
        return 2
    t0 = min(r["start"] for r in rows)
    ends = {}
    for w in sorted({r["worker"] for r in rows}):
        mine = sorted((r for r in rows if r["worker"] == w), key=lambda r: r["start"])
        end = max(r["start"] + r["seconds"] for r in mine) - t0
        ends[w] = end
        busy = sum(r["seconds"] for r in mine)
        print(f"{w}: {len(mine)} tests, busy {busy:.0f} s, ends at {end:.0f} s; last: "
              + ", ".join(f"{r['test']} ({r['seconds']:.0f} s)" for r in mine[-3:]))
    print(f"wall {max(ends.values()):.0f} s, idle tail {max(ends.values()) - min(ends.values()):.0f} s,"
          f" sum {sum(r['seconds'] for r in rows):.0f} s")
    print(f"\nslowest {n}:")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:n]:
        print(f"  {r['seconds']:7.1f} s  {r['worker']:5s} at {r['start'] - t0:6.0f} s  {r['test']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
