"""The calibration memo: popri run's planning keeps the z its search found, and uses a kept z
only after checking it again (popri.privacy.calibration.calibrate, memo=).

    python -m pytest -q tests/test_calibration_memo.py
"""

from __future__ import annotations

import json
import os

import pytest

from popri.pipeline.budget import CalibrationMemo, calibration_memo
from popri.privacy import accounting as A
from popri.privacy import calibration as C

DELTA = 3e-6


class DictMemo:
    def __init__(self):
        self.d: dict[str, float] = {}

    def get(self, key):
        return self.d.get(key)

    def put(self, key, z):
        self.d[key] = z


def counted(q, steps):
    calls = []

    def entries_at(z):
        calls.append(z)
        return A.history_of(z, q, steps)
    return entries_at, calls


# one subsampled RDP search (opacus' fractional orders: the slow case the memo is for) and
# two fast full-participation ones, RDP and PLD
@pytest.mark.parametrize("q,steps,eps,acc", [(0.5, 1, 1.0, "rdp"), (1.0, 2, 1.0, "rdp"),
                                             (1.0, 2, 1.0, "pld")])
def test_a_kept_z_is_the_searched_z_and_costs_two_compositions(q, steps, eps, acc):
    fresh = C.calibrate(eps, DELTA, lambda z: A.history_of(z, q, steps), acc)
    memo = DictMemo()
    f, calls = counted(q, steps)
    first = C.calibrate(eps, DELTA, f, acc, memo=memo)
    searched = len(calls)
    calls.clear()
    again = C.calibrate(eps, DELTA, f, acc, memo=memo)
    assert first == again == fresh and len(memo.d) == 1
    # the key's two probes and the check at z and z - tol: 4 calls, against the search's many
    assert len(calls) == 4 < searched


@pytest.mark.parametrize("how", ["too-small", "too-large", "nan", "negative", "string"])
def test_a_kept_z_that_fails_the_check_is_searched_again_and_replaced(how):
    q, steps, eps = 1.0, 2, 1.0
    f = lambda z: A.history_of(z, q, steps)  # noqa: E731
    fresh = C.calibrate(eps, DELTA, f, "rdp")
    memo = DictMemo()
    C.calibrate(eps, DELTA, f, "rdp", memo=memo)
    (key,) = memo.d
    # too small: would claim eps <= 1 at an epsilon above it; too large: meets the budget but
    # adds more noise than the search's z (not tol-tight)
    memo.d[key] = {"too-small": fresh * 0.9, "too-large": fresh * 1.1, "nan": float("nan"),
                   "negative": -1.0, "string": "2.9"}[how]
    assert C.calibrate(eps, DELTA, f, "rdp", memo=memo) == fresh
    assert memo.d[key] == fresh
    assert A.epsilon(fresh, q, steps, DELTA) <= eps < A.epsilon(fresh - 1e-4, q, steps, DELTA)


def test_the_key_covers_what_decides_z():
    f = lambda z: A.history_of(z, 0.5, 1)  # noqa: E731
    base = dict(eps=1.0, delta=DELTA, entries_at=f, accountant="rdp", tol=1e-4,
                orders=A.ORDERS, interval=None, convention=None)
    k = C.calibration_key(**base)
    for change in (dict(eps=1.5), dict(delta=1e-5), dict(accountant="pld"), dict(tol=1e-3),
                   dict(orders=A.ORDERS[:-1]), dict(interval=1e-3), dict(convention="papers"),
                   dict(entries_at=lambda z: A.history_of(z, 0.5, 2)),
                   dict(entries_at=lambda z: A.history_of(z, 0.4, 1)),
                   dict(entries_at=lambda z: A.history_of(z, 0.5, 1, "fixed"))):
        assert C.calibration_key(**{**base, **change}) != k, change
    assert C.calibration_key(**base) == k


def test_the_disk_memo_round_trips_and_shrugs_off_bad_files(tmp_path):
    m = CalibrationMemo(tmp_path / "c")
    assert m.get("k1") is None
    m.put("k1", 2.92193603515625)
    assert m.get("k1") == 2.92193603515625
    f = tmp_path / "c" / "k1.json"
    for text in ("{", "[]", '{"key": "k2", "z": 3.0}', '{"key": "k1"}', '{"key": "k1", "z": "x"}'):
        f.write_text(text)
        assert m.get("k1") is None, text
    assert not [p for p in (tmp_path / "c").iterdir() if p.name != "k1.json"]  # no temporaries


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_cache_is_skipped(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        CalibrationMemo(d).put("k", 1.0)
        assert CalibrationMemo(d).get("k") is None
    finally:
        d.chmod(0o700)


def test_a_cache_that_is_a_file_is_skipped(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    m = CalibrationMemo(f)
    m.put("k", 1.0)  # no error: the plan goes on without a memo
    assert m.get("k") is None and f.read_text() == "x"


def test_popri_run_plans_keep_their_z_under_popri_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("POPRI_CACHE", str(tmp_path / "cache"))
    m = calibration_memo()
    f = lambda z: A.history_of(z, 1.0, 2)  # noqa: E731
    z = C.calibrate(1.0, DELTA, f, "rdp", memo=m)
    (kept,) = (tmp_path / "cache" / "calibration").iterdir()
    assert json.loads(kept.read_text())["z"] == z
    monkeypatch.setenv("POPRI_CALIBRATION_CACHE", "0")
    assert calibration_memo() is None
