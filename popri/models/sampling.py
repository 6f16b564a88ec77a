"""Per-row seeded samplers: what turns a row's logits into its next token.

    python -c "from popri.models.sampling import philox_uniform; import torch; print(philox_uniform(torch.tensor([1, 2]), torch.tensor([0, 0])))"

Every sample of "Private Federated Learning using Preference-Optimized Synthetic Data" (POPri,
arXiv:2504.16438, Algorithm 1 line 3) and of PrE-Text's Expand (arXiv:2406.02958) is drawn with
its own seed, ``derive_seed(seed, attempt, prompt_id, sample_idx)``, so a row's text does not
depend on which batch it lands in.  Three samplers, one distribution (temperature, then top-p,
then the inverse CDF of the result):

- :class:`RowSampler`: a logits processor for HF ``generate`` (the ``transformers-generate``
  backend): float64 CDF, one ``torch.Generator`` per row, one-hot logits out;
- :class:`Sampler`: popri's decoding loop on CPU (the default there): float32 CDF, one
  ``torch.Generator`` per row, one ``torch.rand`` call per row per step (its samples are the
  reference the CPU path keeps byte-identical);
- :class:`CounterSampler` / :func:`draw_counter`: the CUDA default.  Each row's uniform at its
  step ``s`` is Philox-2x32-10 of the counter ``(s, TAG)`` under the key ``seed``
  ("Parallel Random Numbers: As Easy as 1, 2, 3", Salmon, Moraes, Dror and Shaw, SC 2011,
  section 3.2, Philox; the constants and the 10 rounds of its Random123 reference), computed
  for every row at once in a handful of int64 tensor ops: no generator objects, no per-row
  kernel (35,877 ``uniform_`` launches for one batch of 512 on an H200, issue 38), nothing a
  CUDA graph cannot capture, and a row's stream depends on its seed and step only, never on
  the other rows of the batch.  The 32x32-bit products are split into 16-bit halves so that
  no intermediate exceeds 2**49: the int64 arithmetic never overflows, and the bits are the
  same on every device, in eager mode and under ``torch.compile``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: Philox-2x32's multiplier and Weyl key increment (Salmon et al. 2011, Table 2; Random123)
PHILOX_M = 0xD256D193
PHILOX_W = 0x9E3779B9
PHILOX_ROUNDS = 10
#: the second counter word: popri's decoding streams (a row's stream is (seed, step, TAG))
TAG = 0x706F7072  # "popr"
_M32 = 0xFFFFFFFF


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (stable across runs and platforms)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


# --------------------------------------------------------------------------- counter-based
def philox2x32(c0, c1, key, rounds: int = PHILOX_ROUNDS):
    """Philox-2x32-``rounds`` of the counter ``(c0, c1)`` under ``key``: int64 tensors (or ints)
    holding 32-bit values, broadcast together -> the two 32-bit output words.

    A round maps ``(L, R)`` to ``(hi(M * L) ^ key ^ R, lo(M * L))`` and bumps the key by W
    (Salmon et al. 2011, section 3.2).  ``M * L`` is computed as ``L * M_hi * 2**16 + L * M_lo``
    (each product < 2**48), so no int64 operation overflows."""
    m_hi, m_lo = PHILOX_M >> 16, PHILOX_M & 0xFFFF
    for r in range(rounds):
        if r:
            key = (key + PHILOX_W) & _M32
        a = c0 * m_lo
        b = c0 * m_hi
        lo = (((b & 0xFFFF) << 16) + a) & _M32
        hi = (b + (a >> 16)) >> 16
        c0, c1 = hi ^ key ^ c1, lo
    return c0, c1


def philox_uniform(seeds, steps):
    """One float32 uniform in [0, 1) per row: 24 random bits of Philox-2x32-10 of the counter
    ``(step, TAG)`` under the key ``seed`` (int64 tensors of one shape; seeds < 2**32)."""
    import torch

    out, _ = philox2x32(steps.to(torch.int64) & _M32, TAG, seeds.to(torch.int64) & _M32)
    return (out >> 8).to(torch.float32) * (1.0 / (1 << 24))


def warp(logits, temperature: float, top_p: float):
    """Probabilities after temperature and top-p (float32): the smallest top set whose mass
    reaches ``top_p``, renormalised by the inverse CDF's scaling (not here)."""
    import torch

    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:  # keep the smallest top set whose mass reaches top_p
        sp, si = p.sort(dim=-1, descending=True)
        drop = (sp.cumsum(dim=-1) - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        p = torch.zeros_like(p).scatter_(-1, si, sp)
    return p


def inverse_cdf(probs, u):
    """The token whose CDF interval holds ``u`` (one uniform per row) x the total mass."""
    import torch

    cdf = probs.cumsum(dim=-1)
    x = u.to(cdf.dtype).unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, x, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(1)


def draw_counter(logits, seeds, steps, temperature: float, top_p: float):
    """The next token of every row (no host sync, CUDA-graph capturable): greedy at temperature
    0, else the inverse CDF at the row's Philox uniform for (``seeds``, ``steps``)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    return inverse_cdf(warp(logits, temperature, top_p), philox_uniform(seeds, steps))


class CounterSampler:
    """The counter-based sampler with :class:`Sampler`'s interface (popri's loop): row ``r``'s
    k-th draw uses ``philox_uniform(seeds[r], k)``; the seeds stay on the device."""

    def __init__(self, temperature: float, top_p: float, seeds: Sequence[int], device):
        import torch

        self.torch, self.temperature, self.top_p = torch, float(temperature), float(top_p)
        self.seeds = torch.tensor([int(s) for s in seeds], dtype=torch.int64, device=device)
        self.steps = torch.zeros(len(seeds), dtype=torch.int64, device=device)

    def draw(self, logits, rows: Sequence[int]):
        idx = self.torch.as_tensor(list(rows), dtype=self.torch.int64, device=self.seeds.device)
        out = draw_counter(logits, self.seeds[idx], self.steps[idx], self.temperature,
                           self.top_p)
        self.steps[idx] += 1
        return out


# --------------------------------------------------------------------------- torch.Generator
class Sampler:
    """One seeded generator per row; ``draw(logits, rows)`` returns a token per row (the CPU
    default of popri's loop: float32 inverse CDF, one ``torch.rand`` per row per step)."""

    def __init__(self, temperature: float, top_p: float, seeds: Sequence[int], device):
        import torch

        self.torch, self.temperature, self.top_p = torch, float(temperature), float(top_p)
        self.gens = ([torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
                     if self.temperature > 0 else [])

    def probs(self, logits):
        return warp(logits, self.temperature, self.top_p)

    def draw(self, logits, rows: Sequence[int]):
        torch = self.torch
        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        cdf = self.probs(logits).cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=self.gens[r], device=cdf.device)
                       for r in rows]).unsqueeze(1) * cdf[:, -1:]
        return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(1)


SAMPLERS = {"generator": Sampler, "counter": CounterSampler}


class RowSampler:
    """Draws the next token of every row by inverse-CDF sampling with its own seeded generator.

    A logits processor for HF ``generate`` in greedy mode: it applies transformers' own
    temperature and top-p warpers, samples one token per row from the resulting distribution
    (``searchsorted`` of a uniform on the float64 CDF: exact categorical sampling) and returns
    logits that are -inf everywhere except the drawn token, so greedy decoding emits it.

    Why not ``do_sample=True``: on this CPU ``torch.multinomial`` over SmolLM2's 49k vocabulary
    takes ~90 ms for 8 rows against ~1 ms here, and one generator per row (seeded from
    ``(seed, attempt, prompt_id, sample_idx)`` as the vllm path does) makes a row's sample
    independent of which batch it lands in.
    """

    def __init__(self, temperature: float, top_p: float, seeds: Sequence[int], device):
        import torch
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        self.torch = torch
        self.warpers = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids, scores):
        torch = self.torch
        for w in self.warpers:
            scores = w(input_ids, scores)
        probs = torch.softmax(scores.float(), dim=-1).double()
        cdf = probs.cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=g, device=g.device, dtype=torch.float64)
                       for g in self.gens]).unsqueeze(1) * cdf[:, -1:]
        idx = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, idx, 0.0)
