"""Deterministic client subsets, per-client caps and client-level train/val/test splits.

    python -m pytest -q tests/test_bench.py -k "split or cap"

Every choice here is a function of ``seed`` and the client / sample ids only, never of the
order clients were read in, so adding clients to a source never moves an existing client
(the "regularly updated" LargeFedBench use of "Private Federated Learning using
Preference-Optimized Synthetic Data", POPri, arXiv:2504.16438, section 4).

- ``hash`` split: ``u = sha256(f"{seed}:{client_id}") / 2**256``; ``u < test_frac`` -> test,
  ``u < test_frac + val_frac`` -> val, else train.
- ``date`` split: clients sorted by (date, client_id); the latest ``round(test_frac * n)`` go to
  test, the ``round(val_frac * n)`` before them to val (no future leaks into train).
- ``select_clients``: the ``max_clients`` clients with the smallest ``sha256(f"{seed}:select:{id}")``.
- ``cap_samples``: keep the ``m`` samples with the smallest ``sha256(f"{seed}:cap:{sample id}")``,
  in their original order ("PrE-Text: Training Language Models on Private Federated Data in
  the Age of LLMs", PrE-Text, arXiv:2406.02958, uses 8 samples per client).
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterable, Mapping, Sequence, TypeVar

from popri.core.errors import InputError
from popri.specs.data import SPLIT_RULES as RULES  # hash, date: declared once, in the spec

SPLITS = ("train", "val", "test")
T = TypeVar("T")


def unit_hash(key: str) -> float:
    """sha256 of ``key`` as a number in [0, 1)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest(), "big") / float(1 << 256)


def check_fractions(val_frac: float, test_frac: float) -> None:
    for name, f in (("val_frac", val_frac), ("test_frac", test_frac)):
        if not (0.0 <= f < 1.0) or math.isnan(f):
            raise InputError(f"must be in [0, 1), got {f}", field=name)
    if val_frac + test_frac >= 1.0:
        raise InputError(f"val_frac + test_frac must be < 1 (got {val_frac} + {test_frac}); "
                         "nothing would be left for train", field="val_frac")


def select_clients(client_ids: Iterable[str], max_clients: int | None, seed: int) -> list[str]:
    """All clients (sorted), or the seeded subset of ``max_clients`` of them (sorted)."""
    ids = sorted(set(client_ids))
    if max_clients is None or max_clients >= len(ids):
        return ids
    ranked = sorted(ids, key=lambda c: (hashlib.sha256(f"{seed}:select:{c}".encode()).digest(), c))
    return sorted(ranked[:max_clients])


def cap_samples(items: Sequence[T], ids: Sequence[str], m: int | None, seed: int) -> list[T]:
    """At most ``m`` of ``items`` (chosen by seeded hash of their ids), original order kept."""
    if m is None or len(items) <= m:
        return list(items)
    order = sorted(range(len(items)),
                   key=lambda i: (hashlib.sha256(f"{seed}:cap:{ids[i]}".encode()).digest(), i))
    keep = sorted(order[:m])
    return [items[i] for i in keep]


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def assign_splits(client_dates: Mapping[str, str | None], rule: str, val_frac: float,
                  test_frac: float, seed: int, source: str = "") -> dict[str, str]:
    """``{client_id: "train"|"val"|"test"}`` by the hash or the date rule."""
    check_fractions(val_frac, test_frac)
    if rule == "hash":
        out = {}
        for c in client_dates:
            u = unit_hash(f"{seed}:{c}")
            out[c] = "test" if u < test_frac else "val" if u < test_frac + val_frac else "train"
        return out
    if rule != "date":
        raise InputError(f"unknown split rule {rule!r} (use one of {', '.join(RULES)})", field="split")
    missing = sorted(c for c, d in client_dates.items() if not d)
    if missing:
        what = "has no dates" if len(missing) == len(client_dates) else \
            f"has {len(missing)} clients without a date (e.g. {missing[0]!r})"
        raise InputError(f"--split date needs a date for every client, but the source {what}; "
                         "use --split hash", path=source or None, field="date")
    ordered = sorted(client_dates, key=lambda c: (str(client_dates[c]), c))
    n = len(ordered)
    n_test = _round(test_frac * n)
    n_val = _round(val_frac * n)
    n_train = n - n_test - n_val
    out = {}
    for i, c in enumerate(ordered):
        out[c] = "train" if i < n_train else "val" if i < n_train + n_val else "test"
    return out
