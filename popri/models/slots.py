"""Continuous batching over a static KV cache: the ``transformers`` backend's CUDA decoder.

    python benchmarks/bench_gen.py --device cuda --engines loop slots --batch-sizes 64 256 1024
    python -c "from popri.models.decoding import DecodeOptions; print(DecodeOptions().resolve('cuda'))"

What an H200 profile of popri's loop (popri/models/decoding.py) at batch 512 showed (issue 38):
cuDNN's attention building a graph per call (47 % of the host time), 139,537 kernel launches
for 43,520 tokens, one ``uniform_`` per row per step, the grouped-query K/V expanded by a copy
twice per layer per step, the dynamic cache growing by ``cat`` and shrinking by ``index``.  This
engine removes each of them by construction:

- **a static cache of slots**: ``batch_size`` slots x ``max_len`` positions per layer, allocated
  once; each slot holds one row's sequence from position 0 (no padding inside the cache), and
  a decode step writes one K/V per slot at that slot's own position (``index_put``), so nothing
  grows, shrinks or is copied per step ("Efficient Memory Management for Large Language Model
  Serving with PagedAttention", Kwon et al., SOSP 2023, arXiv:2309.06180, section 4: a request's
  KV cache kept in place while the batch changes);
- **continuous batching**: a finished row frees its slot, and waiting rows are prefilled into
  the free slots once ``refill`` (1/8) of the batch is free ("Orca: A Distributed Serving
  System for Transformer-Based Generative Models", Yu et al., OSDI 2022, section 3.1,
  iteration-level scheduling), so the batch stays full until the queue is empty; then the live
  rows are compacted into the next smaller bucket (powers of two) so the tail does not pay for
  the whole batch.  The J rows of a prompt that are prefilled together share one prefill;
- **the decode step in a CUDA graph** (one per bucket; ``capture='graph'``): the forward, the
  sampling and the cache writes replay as one graph ("Accelerating PyTorch with CUDA Graphs",
  PyTorch blog, 2021; ``torch.cuda.graph``), or ``torch.compile`` of the step
  (``capture='compile'``, also on CPU);
- **grouped-query attention without expanded K/V**: in a decode step all g query heads of a
  K/V head sit at one position, so they are folded into SDPA's query-length axis,
  ``[b, H_kv, g, d] x [b, H_kv, L, d]``, one kernel reading each K/V once ("GQA: Training
  Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", Ainslie et al.,
  arXiv:2305.13245, section 2); SDPA runs without cuDNN (:func:`decoding.attention_policy`);
- **sampling in one pass**: :func:`popri.models.sampling.draw_counter` (Philox keyed by the
  row's seed and its own step, so a refilled row's stream is the one it would have had in any
  other slot or batch).

The model is driven through transformers' own forward (any causal LM whose attention layers
call ``cache.update`` and the attention-function registry: Llama, Qwen2/3, Mistral, Gemma 3,
...): the engine passes a ready 4-D boolean mask, its own cache object and the registered
attention ``popri_slots``.  :meth:`SlotRunner.check` compares the engine's logits with a plain
forward on two prompts first; a model it does not fit falls back to popri's loop.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Callable, Sequence

import numpy as np

from popri.core import log
from popri.models.decoding import accepts, attention_policy
from popri.models.sampling import draw_counter

ATTN_NAME = "popri_slots"
_REGISTERED = False


def slot_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                   scaling: float | None = None, sliding_window: int | None = None,
                   softcap: float | None = None, **kwargs):
    """The ``popri_slots`` attention function: ``query`` [b, H, q, d], ``key``/``value``
    [b, H_kv, S, d], ``attention_mask`` [b, 1, q, S] bool (True: attend) -> [b, q, H, d].

    q == 1 (a decode step): the H / H_kv query heads of each K/V head are folded into the query
    axis (no expanded K/V); q > 1 (a prefill): SDPA with ``enable_gqa``."""
    import torch.nn.functional as F

    if softcap is not None or kwargs.get("s_aux") is not None:
        raise NotImplementedError("logit soft-capping / attention sinks")
    if sliding_window is not None and key.shape[2] > sliding_window:
        raise NotImplementedError(f"a sliding window ({sliding_window}) shorter than the cache")
    b, h, q, d = query.shape
    hkv = key.shape[1]
    if q == 1:
        out = F.scaled_dot_product_attention(query.reshape(b, hkv, h // hkv, d), key, value,
                                             attn_mask=attention_mask, scale=scaling)
        return out.reshape(b, h, 1, d).transpose(1, 2), None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         scale=scaling, enable_gqa=hkv != h)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_NAME, slot_attention)
        _REGISTERED = True


@contextlib.contextmanager
def using_attention(model, name: str):
    """``model``'s attention implementation set to ``name`` for the block (restored after)."""
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = name
    try:
        yield
    finally:
        cfg._attn_implementation = before


class SlotCache:
    """The KV cache transformers' attention layers ``update``: per layer K and V of shape
    [slots, H_kv, max_len, d] (allocated at the first update).

    Decode (``fill is None``): the step's K/V of slot i go to position ``pos[i]``; the whole
    bucket ``[:b]`` is returned (the mask hides the positions beyond each slot's length).
    Prefill (``fill = (dst_slot, dst_pos, src_row, src_pos)``): the prompts' K/V are scattered
    into their slots, and attention runs within the prompts themselves."""

    is_compileable = True

    def __init__(self, slots: int, max_len: int, device):
        import torch

        self.slots, self.max_len, self.device = slots, max_len, device
        self.k: list = []
        self.v: list = []
        self.ar = torch.arange(slots, device=device)
        self.b, self.pos, self.fill = slots, None, None

    def update(self, key, value, layer_idx: int, *args, **kwargs):
        import torch

        if layer_idx == len(self.k):
            shape = (self.slots, key.shape[1], self.max_len, key.shape[3])
            self.k.append(torch.zeros(shape, dtype=key.dtype, device=self.device))
            self.v.append(torch.zeros(shape, dtype=value.dtype, device=self.device))
        K, V = self.k[layer_idx], self.v[layer_idx]
        if self.fill is not None:
            ds, dp, sr, sp = self.fill
            K[ds, :, dp] = key[sr, :, sp]
            V[ds, :, dp] = value[sr, :, sp]
            return key, value
        b = self.b
        K[self.ar[:b], :, self.pos] = key[:, :, 0]
        V[self.ar[:b], :, self.pos] = value[:, :, 0]
        return K[:b], V[:b]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.k)


def buckets(batch: int, exact: bool) -> list[int]:
    """The batch sizes a run shrinks through once its queue is empty: ``batch`` and the powers
    of two below it down to 8 (graphs and compiled steps: one per size), or every size
    (eager)."""
    if exact:
        return list(range(batch, 0, -1))
    out, p = [batch], 1
    while p * 2 < batch:
        p *= 2
    while 8 <= p < batch:
        out.append(p)
        p //= 2
    return out


class SlotRunner:
    """A model's static cache, input buffers and captured steps (kept across runs of one
    engine: the graphs are captured once per bucket and reused while ``max_len`` fits)."""

    def __init__(self, model, tok, *, slots: int, max_len: int, temperature: float,
                 top_p: float, capture: str = "none", attention: str = "auto",
                 prefill_tokens: int = 16384):
        import torch

        register_attention()
        self.torch, self.model, self.tok = torch, model, tok
        self.dev = model.device
        self.cuda = self.dev.type == "cuda"
        self.slots, self.max_len = slots, max_len
        self.temperature, self.top_p = temperature, top_p
        self.capture, self.attention = capture, attention
        self.prefill_tokens = prefill_tokens
        self.ckey = "cache" if accepts(type(model), "cache") else "past_key_values"
        self.extra = {"logits_to_keep": 1} if accepts(type(model), "logits_to_keep") else {}
        self.cache = SlotCache(slots, max_len, self.dev)
        z = dict(dtype=torch.int64, device=self.dev)
        self.tok_in, self.pos = torch.zeros(slots, **z), torch.zeros(slots, **z)
        self.seeds, self.steps = torch.zeros(slots, **z), torch.zeros(slots, **z)
        self.out = torch.zeros(slots, **z)
        self.ar_len = torch.arange(max_len, device=self.dev)
        self.graphs: dict[int, object] = {}
        self.compiled = None
        self.pool = None

    # ------------------------------------------------------------------ device side
    def ctx(self):
        stack = contextlib.ExitStack()
        stack.enter_context(self.torch.inference_mode())
        stack.enter_context(using_attention(self.model, ATTN_NAME))
        stack.enter_context(attention_policy(str(self.dev), self.attention))
        return stack

    def forward(self, b: int):
        """Logits of the next token of slots ``[:b]`` (their input token at their position)."""
        c = self.cache
        c.b, c.pos, c.fill = b, self.pos[:b], None
        mask = (self.ar_len[None, :] <= self.pos[:b, None])[:, None, None, :]
        res = self.model(input_ids=self.tok_in[:b, None], attention_mask=mask,
                         position_ids=self.pos[:b, None], use_cache=True, **{self.ckey: c},
                         **self.extra)
        return res.logits[:, -1]

    def _step(self, b: int):
        nxt = draw_counter(self.forward(b), self.seeds[:b], self.steps[:b], self.temperature,
                           self.top_p)
        self.out[:b].copy_(nxt)

    def _step_compiled(self, b: int):
        if self.compiled is None:
            self.compiled = self.torch.compile(self._step, dynamic=False)
        self.compiled(b)

    def _graph(self, b: int):
        torch = self.torch
        fn = self._step_compiled if self.capture.startswith("compile") else self._step
        state = [x.clone() for x in (self.tok_in, self.pos, self.steps)]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn(b)
        torch.cuda.current_stream().wait_stream(s)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            fn(b)
        for x, y in zip((self.tok_in, self.pos, self.steps), state):
            x.copy_(y)
        return g

    def captured(self, b: int):
        """The CUDA graph of bucket ``b`` (captured on first use), or None when capture is off
        or failed (then the engine decodes eagerly; one warning)."""
        if "graph" not in self.capture:
            return None
        if b not in self.graphs:
            try:
                self.graphs[b] = self._graph(b)
            except Exception as e:  # noqa: BLE001 -- a model that cannot be captured
                log.warn(f"gen: CUDA graph capture failed ({type(e).__name__}: {e}); "
                         "decoding eagerly")
                self.capture = "compile" if self.capture.startswith("compile") else "none"
                self.graphs.clear()
                return None
        return self.graphs[b]

    def prepare(self, sizes: Sequence[int]) -> None:
        """Capture the graphs of the buckets ``sizes`` now (not inside a timed run)."""
        if "graph" in self.capture:
            with self.ctx():
                for b in sizes:
                    self.captured(b)
            self.pos.zero_()

    def step(self, b: int) -> np.ndarray:
        """One decode step of slots ``[:b]`` -> their new tokens (host); positions, steps and
        input tokens advance."""
        g = self.captured(b)
        if g is not None:
            g.replay()
        elif self.capture.startswith("compile"):
            self._step_compiled(b)
        else:
            self._step(b)
        self.tok_in[:b].copy_(self.out[:b])
        self.pos[:b].add_(1).clamp_(max=self.max_len - 1)
        self.steps[:b].add_(1)
        return self.out[:b].cpu().numpy()

    def prefill(self, ids: list[list[int]], slot_of: list[int], prompt_of: list[int],
                seeds: list[int]) -> np.ndarray:
        """Encode the distinct prompts ``ids`` and place row k (prompt ``prompt_of[k]``, seed
        ``seeds[k]``) in slot ``slot_of[k]``: its K/V at positions 0..len-1, its first token
        sampled (its step 0) -> those first tokens (host)."""
        torch = self.torch
        firsts = np.zeros(len(slot_of), dtype=np.int64)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        groups, cur, cur_max = [], [], 0
        for i in order:  # prompts of similar length together, <= prefill_tokens per forward
            m = max(cur_max, len(ids[i]))
            if cur and m * (len(cur) + 1) > self.prefill_tokens:
                groups.append(cur)
                cur, m = [], len(ids[i])
            cur.append(i)
            cur_max = m
        if cur:
            groups.append(cur)
        rows_of: dict[int, list[int]] = {}
        for k, p in enumerate(prompt_of):
            rows_of.setdefault(p, []).append(k)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        for grp in groups:
            P = max(len(ids[i]) for i in grp)
            inp = torch.full((len(grp), P), pad, dtype=torch.int64)
            real = torch.zeros((len(grp), P), dtype=torch.bool)
            for j, i in enumerate(grp):
                inp[j, P - len(ids[i]):] = torch.tensor(ids[i])
                real[j, P - len(ids[i]):] = True
            inp, real = inp.to(self.dev), real.to(self.dev)
            pos = (real.long().cumsum(-1) - 1).clamp_(min=0)
            causal = torch.ones(P, P, dtype=torch.bool, device=self.dev).tril_()
            eye = torch.eye(P, dtype=torch.bool, device=self.dev)
            mask = (causal & (real[:, None, None, :] | eye))  # a pad query sees itself
            ds, dp, sr, sp, rk, rj = [], [], [], [], [], []
            for j, i in enumerate(grp):
                n = len(ids[i])
                for k in rows_of.get(i, []):
                    ds += [slot_of[k]] * n
                    dp += range(n)
                    sr += [j] * n
                    sp += range(P - n, P)
                    rk.append(k)
                    rj.append(j)
            t = lambda x: torch.tensor(x, dtype=torch.int64, device=self.dev)  # noqa: E731
            self.cache.fill = (t(ds), t(dp), t(sr), t(sp))
            try:
                res = self.model(input_ids=inp, attention_mask=mask, position_ids=pos,
                                 use_cache=True, **{self.ckey: self.cache}, **self.extra)
            finally:
                self.cache.fill = None
            slots_t, rows_t = t([slot_of[k] for k in rk]), t(rj)
            lens = t([len(ids[grp[j]]) for j in rj])
            self.seeds[slots_t] = t([seeds[k] for k in rk])
            self.steps[slots_t] = 0
            first = draw_counter(res.logits[:, -1][rows_t], self.seeds[slots_t],
                                 self.steps[slots_t], self.temperature, self.top_p)
            self.tok_in[slots_t] = first
            self.pos[slots_t] = lens
            self.steps[slots_t] = 1
            firsts[rk] = first.cpu().numpy()
        return firsts

    def release(self, slots: Sequence[int]) -> None:
        if len(slots):
            self.pos[self.torch.as_tensor(list(slots), device=self.dev)] = 0

    def compact(self, live: np.ndarray) -> None:
        """Move the live slots' rows to slots ``[:len(live)]`` (cache, tokens, positions)."""
        torch = self.torch
        idx = torch.as_tensor(live, dtype=torch.int64, device=self.dev)
        n = len(live)
        for x in (self.tok_in, self.pos, self.seeds, self.steps, *self.cache.k, *self.cache.v):
            x[:n] = x[idx]
        self.pos[n:] = 0

    # ------------------------------------------------------------------ checks
    def check(self, prompts: Sequence[list[int]], next_tokens: Sequence[int],
              rtol: float) -> str | None:
        """Why this engine does not reproduce the model's own forward on ``prompts`` (each
        followed by its next token), or None.  Uses slots [:len(prompts)]."""
        torch = self.torch
        n = len(prompts)
        try:
            with torch.inference_mode():
                ref = []
                for p, x in zip(prompts, next_tokens):
                    r = self.model(input_ids=torch.tensor([p + [x]], device=self.dev))
                    ref.append(r.logits[0, -1].float())
            with self.ctx():
                self.prefill([list(p) for p in prompts], list(range(n)), list(range(n)),
                             [0] * n)
                self.tok_in[:n] = torch.tensor(list(next_tokens), device=self.dev)
                got = self.forward(n).float()
        except Exception as e:  # noqa: BLE001 -- any failure means: not this engine
            return f"{type(e).__name__}: {e}"
        finally:
            self.release(range(n))
        for i in range(n):
            scale = ref[i].abs().max().item()
            err = (got[i] - ref[i]).abs().max().item()
            if not err <= rtol * max(scale, 1e-6):
                return f"logits differ from the model's own forward by {err:.3g} (scale {scale:.3g})"
        return None


def decode_slots(runner: SlotRunner, ids: Sequence[list[int]], prompt_of: Sequence[int],
                 seeds: Sequence[int], *, max_new_tokens: int, marker: str,
                 eos_ids: Sequence[int], stop_ids: Sequence[int], refill: float = 0.125,
                 tick: Callable[[int, int], None] | None = None) -> list[tuple[str, int]]:
    """Sample one continuation per row (row k continues prompt ``ids[prompt_of[k]]`` with seed
    ``seeds[k]``) through ``runner``'s slots -> ``[(text, generated tokens)]`` in row order.

    A row ends as in :func:`popri.models.decoding.decode_batch`: at an end-of-sequence token
    (not counted), at a token that completes ``marker`` in its decoded tail, or after
    ``max_new_tokens``."""
    tok = runner.tok
    n = len(prompt_of)
    out = np.zeros((n, max_new_tokens), dtype=np.int64)
    lens = np.zeros(n, dtype=np.int64)
    counted = np.zeros(n, dtype=np.int64)
    eos_a = np.array(sorted(set(int(i) for i in eos_ids)), dtype=np.int64)
    stop_a = np.array(sorted(set(int(i) for i in stop_ids)), dtype=np.int64)
    window = len(tok(marker, add_special_tokens=False)["input_ids"]) + 4
    exact = runner.capture == "none"  # eager: any batch size; graphs / compiled: buckets
    sizes = buckets(min(runner.slots, n), exact)
    b = sizes[0]
    slot_row = np.full(runner.slots, -1, dtype=np.int64)
    waiting = deque(range(n))

    def record(slots: np.ndarray, toks: np.ndarray) -> None:
        rows = slot_row[slots]
        t = lens[rows]
        out[rows, t] = toks
        lens[rows] = t + 1
        eos = np.isin(toks, eos_a)
        counted[rows] += ~eos
        done = eos | (lens[rows] >= max_new_tokens)
        for i in np.nonzero(np.isin(toks, stop_a) & ~done)[0]:
            r = rows[i]
            tail = out[r, max(0, lens[r] - window):lens[r]]
            done[i] = marker in tok.decode(tail.tolist(), skip_special_tokens=True)
        fin = slots[done]
        if len(fin):
            slot_row[fin] = -1
            runner.release(fin)
            if tick is not None:
                tick(len(fin), int(counted[rows[done]].sum()))

    with runner.ctx():
        while True:
            live = np.nonzero(slot_row[:b] >= 0)[0]
            free = np.nonzero(slot_row[:b] < 0)[0]
            if waiting and len(free) and (len(free) >= max(1, int(np.ceil(refill * b)))
                                          or len(free) >= len(waiting) or not len(live)):
                take = [waiting.popleft() for _ in range(min(len(free), len(waiting)))]
                fs = free[:len(take)]
                uniq: dict[int, int] = {}
                p_idx = [uniq.setdefault(int(prompt_of[r]), len(uniq)) for r in take]
                src = list(uniq)
                slot_row[fs] = take
                firsts = runner.prefill([list(ids[p]) for p in src], fs.tolist(), p_idx,
                                        [int(seeds[r]) for r in take])
                record(fs, firsts)
                continue
            if not len(live):
                if waiting:
                    continue
                break
            if not waiting and not exact:
                while len(sizes) > 1 and len(live) <= sizes[1]:
                    sizes.pop(0)
                if sizes[0] < b:
                    runner.compact(live)
                    slot_row[:len(live)] = slot_row[live]
                    slot_row[len(live):] = -1
                    b = sizes[0]
                    live = np.arange(len(live))
            elif not waiting and exact and len(live) < b:
                runner.compact(live)
                slot_row[:len(live)] = slot_row[live]
                slot_row[len(live):] = -1
                b = len(live)
                live = np.arange(b)
            toks = runner.step(b)
            record(live, toks[live])
    return [(tok.decode(out[r, :lens[r]].tolist(), skip_special_tokens=True), int(counted[r]))
            for r in range(n)]
