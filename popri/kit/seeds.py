"""The named seed rules of ``popri run``: every stage's seed derives from the run's ``seed``.

    from popri.kit import final_seed, round_seed
    python -m pytest -q tests/test_run.py -k draws

Round t's stages take :func:`round_seed` (seed, t), the final synthetic set :func:`final_seed`,
draw k of a stage :func:`draw_seed` (its seed, k), the test sample of draw k
:func:`sample_seed` (seed, k): no two of them share a seed.
"""

from __future__ import annotations


def round_seed(seed: int, t: int) -> int:
    """The seed of round t's stages (generation, scoring, tuning): ``seed * 1000 + t``."""
    return seed * 1000 + t


def final_seed(seed: int) -> int:
    """The seed of the final synthetic set (after the last round): ``seed * 1000 + 999``."""
    return seed * 1000 + 999


def draw_seed(seed: int, k: int) -> int:
    """The seed of draw ``k`` (1, 2, ...) of a stage whose own seed is ``seed`` (draw 0): a
    stream of its own, sha256 of ("popri-draw", seed, k) cut to 31 bits, so that no draw shares
    a seed with a round, the final set or a draw of another run seed (``seed + k`` did:
    draw k of run seed s was round k - 1 of run seed s + 1)."""
    return int(seed) if k == 0 else _stream("popri-draw", seed, k)


def sample_seed(seed: int, k: int) -> int:
    """The seed of draw ``k``'s (0, 1, ...) sample of test records (``draw_sources: test``,
    issue 65): sha256 of ("popri-test-sample", seed, k) cut to 31 bits, a stream apart from
    the bootstrap's (which ``seed`` itself seeds) and from every stage seed."""
    return _stream("popri-test-sample", seed, k)


def _stream(tag: str, seed: int, k: int) -> int:
    """sha256 of "TAG:seed:k" cut to 31 bits: a seed stream of its own per tag."""
    import hashlib

    h = hashlib.sha256(f"{tag}:{int(seed)}:{int(k)}".encode()).digest()
    return int.from_bytes(h[:4], "big") >> 1
