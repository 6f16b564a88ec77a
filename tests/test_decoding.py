"""The samplers and decode options of popri.models.sampling / popri.models.decoding (issue 38).

    python -m pytest -q tests/test_decoding.py

The counter-based sampler (Philox-2x32-10 of (row seed, step), the CUDA default): known answers,
exact int64 arithmetic, uniformity, independence across rows and steps, and a row's stream that
depends on its own seed and step only.
"""

import numpy as np
import pytest

from popri.models import sampling
from popri.models.decoding import DecodeOptions
from popri.models.slots import buckets


def philox_ref(c0: int, c1: int, key: int, rounds: int = 10) -> tuple[int, int]:
    """Philox-2x32 in Python's unbounded integers (Random123's philox2x32round / bumpkey)."""
    for r in range(rounds):
        if r:
            key = (key + 0x9E3779B9) & 0xFFFFFFFF
        prod = 0xD256D193 * c0
        c0, c1 = ((prod >> 32) ^ key ^ c1) & 0xFFFFFFFF, prod & 0xFFFFFFFF
    return c0, c1


def test_philox_known_answers_of_random123():
    import torch

    # Random123's kat_vectors: "philox2x32 10 ctr0 ctr1 key -> out0 out1"
    kat = [((0, 0, 0), (0xFF1DAE59, 0x6CD10DF2)),
           ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0x2C3F628B, 0xAB4FD7AD)),
           ((0x243F6A88, 0x85A308D3, 0x13198A2E), (0xDD7CE038, 0xF62A4C12))]
    for (c0, c1, k), want in kat:
        assert sampling.philox2x32(c0, c1, k) == want
        got = sampling.philox2x32(torch.tensor([c0]), torch.tensor([c1]), torch.tensor([k]))
        assert (int(got[0]), int(got[1])) == want
        assert philox_ref(c0, c1, k) == want


def test_philox_int64_tensors_equal_the_unbounded_reference():
    """No int64 operation overflows: random and extreme 32-bit inputs give the exact bits."""
    import torch

    rng = np.random.default_rng(0)
    c0 = np.concatenate([rng.integers(0, 2**32, 500), [0, 1, 2**31 - 1, 2**31, 2**32 - 1]])
    c1 = rng.integers(0, 2**32, len(c0))
    key = np.concatenate([rng.integers(0, 2**32, len(c0) - 2), [0, 2**32 - 1]])
    a, b = sampling.philox2x32(torch.tensor(c0), torch.tensor(c1), torch.tensor(key))
    ref = [philox_ref(int(x), int(y), int(k)) for x, y, k in zip(c0, c1, key)]
    assert a.tolist() == [r[0] for r in ref] and b.tolist() == [r[1] for r in ref]
    assert a.dtype == torch.int64 and int(a.min()) >= 0 and int(a.max()) < 2**32


def test_counter_uniforms_are_uniform_24_bit_and_in_0_1():
    import torch
    from scipy.stats import kstest

    seeds = torch.arange(200_000) * 7919 % (2**31)
    u = sampling.philox_uniform(seeds, torch.zeros_like(seeds)).double().numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert kstest(u, "uniform").pvalue > 0.01
    scaled = u * 2**24
    assert np.array_equal(scaled, np.floor(scaled))  # multiples of 2^-24: 24 random bits
    assert len(np.unique(scaled)) > 0.99 * len(u)   # collisions as for 24 bits, not fewer bits
    steps = torch.arange(200_000)  # one row's stream along its steps
    v = sampling.philox_uniform(torch.full_like(steps, 12345), steps).double().numpy()
    assert kstest(v, "uniform").pvalue > 0.01


def test_counter_streams_are_independent_across_rows_and_steps():
    """Neighbouring seeds and neighbouring steps: uncorrelated, and their pairs fill the unit
    square evenly (chi-square of a 16 x 16 histogram)."""
    import torch
    from scipy.stats import chisquare

    rows, steps = 2000, 64
    s = torch.arange(rows)[:, None].expand(rows, steps).reshape(-1)
    t = torch.arange(steps)[None, :].expand(rows, steps).reshape(-1)
    u = sampling.philox_uniform(s, t).double().numpy().reshape(rows, steps)
    for a, b in ((u[:-1], u[1:]), (u[:, :-1], u[:, 1:])):  # next seed; next step
        a, b = a.ravel(), b.ravel()
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.01
        h, _, _ = np.histogram2d(a, b, bins=16, range=[[0, 1], [0, 1]])
        assert chisquare(h.ravel()).pvalue > 0.001
    assert abs(np.corrcoef(u.T).mean() - 1 / steps) < 0.01  # no common component across steps


def test_a_rows_draw_depends_on_its_seed_and_step_only():
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    seeds = torch.tensor([11, 22, 33, 44, 55, 66])
    steps = torch.tensor([0, 3, 3, 9, 1, 0])
    full = sampling.draw_counter(logits, seeds, steps, 1.0, 1.0)
    perm = torch.tensor([4, 0, 5, 2])  # another batch: fewer rows, another order
    sub = sampling.draw_counter(logits[perm], seeds[perm], steps[perm], 1.0, 1.0)
    assert sub.tolist() == full[perm].tolist()
    for i in range(6):  # alone
        one = sampling.draw_counter(logits[i:i + 1], seeds[i:i + 1], steps[i:i + 1], 1.0, 1.0)
        assert one.item() == full[i].item()
    # the CounterSampler of the loop: a row's k-th draw is its step k wherever it sits
    cs = sampling.CounterSampler(1.0, 1.0, [11, 22, 33], "cpu")
    first = cs.draw(logits[:3], [0, 1, 2])
    second = cs.draw(logits[1:3], [1, 2])
    assert first.tolist() == sampling.draw_counter(
        logits[:3], seeds[:3], torch.zeros(3, dtype=torch.long), 1.0, 1.0).tolist()
    assert second.tolist() == sampling.draw_counter(
        logits[1:3], seeds[1:3], torch.ones(2, dtype=torch.long), 1.0, 1.0).tolist()


def test_counter_sampler_matches_softmax_and_respects_top_p():
    import torch

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]])
    n = 20000
    seeds = torch.arange(n) * 2654435761 % 2**31
    zero = torch.zeros(n, dtype=torch.long)
    draws = sampling.draw_counter(logits.repeat(n, 1), seeds, zero, 1.0, 1.0)
    freq = torch.bincount(draws, minlength=6).double() / n
    assert (freq - torch.softmax(logits[0].double(), -1)).abs().max() < 0.015
    draws = sampling.draw_counter(logits.repeat(n, 1), seeds, zero, 0.5, 0.9)
    p = torch.softmax(logits[0].double() / 0.5, -1)  # nucleus 0.9 = {0, 1}
    assert set(draws.tolist()) == {0, 1}
    assert abs((draws == 0).double().mean() - p[0] / (p[0] + p[1])) < 0.015
    assert sampling.draw_counter(logits, seeds[:1], zero[:1], 0.0, 1.0).tolist() == [0]


def test_generator_sampler_is_unchanged_by_the_split():
    """The CPU default's draws (Sampler: one torch.Generator per row) are the ones the loop
    drew before issue 38 (the split moved the class; its arithmetic is the same)."""
    import torch

    from popri.models import decoding

    assert decoding.Sampler is sampling.Sampler
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -3.0]]).repeat(4, 1)
    s = sampling.Sampler(1.0, 1.0, [1, 2, 3, 4], "cpu")
    got = s.draw(logits, [0, 1, 2, 3])
    cdf = torch.softmax(logits.float(), -1).cumsum(-1)
    u = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(k)) for k in (1, 2, 3, 4)])
    want = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).squeeze(1)
    assert got.tolist() == want.tolist()


def test_decode_options_resolve_by_device_and_parse():
    cpu, cuda = DecodeOptions().resolve("cpu"), DecodeOptions().resolve("cuda:0")
    assert (cpu.decoder, cpu.sampler, cpu.capture) == ("loop", "generator", "none")
    assert (cuda.decoder, cuda.sampler, cuda.capture) == ("slots", "counter", "graph")
    on_cpu = DecodeOptions.parse("decoder=slots,capture=compile,refill=0.5").resolve("cpu")
    assert (on_cpu.decoder, on_cpu.sampler, on_cpu.capture, on_cpu.refill) == (
        "slots", "counter", "compile", 0.5)
    assert DecodeOptions.parse("slots").decoder == "slots" and DecodeOptions.parse(None).decoder == "auto"
    assert DecodeOptions.parse("loop").resolve("cuda").capture == "none"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        DecodeOptions(decoder="slots", capture="graph").resolve("cpu")
    with pytest.raises(ValueError, match="decoder must be one of"):
        DecodeOptions(decoder="paged").resolve("cpu")


def test_buckets_shrink_by_powers_of_two():
    assert buckets(1024, False) == [1024, 512, 256, 128, 64, 32, 16, 8]
    assert buckets(24, False) == [24, 16, 8]
    assert buckets(5, False) == [5] and buckets(9, False) == [9, 8]
    assert buckets(1, False) == [1]
    assert buckets(4, True) == [4, 3, 2, 1]
