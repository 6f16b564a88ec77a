"""Fast in-process decoding: the ``transformers`` backend's own sampling loop.

    python benchmarks/bench_gen.py                  # tokens/s against the model.generate path
    popri gen data/c4-init.jsonl --prompts 12 -J 6 --batch-size 16 --out r0.jsonl

The samples POPri and PrE-Text score are sampled here ("Private Federated Learning using
Preference-Optimized Synthetic Data", POPri, arXiv:2504.16438, Algorithm 1 line 3; "PrE-Text",
arXiv:2406.02958, the generation inside Expand).  What the profile of the ``model.generate``
path showed on the 2-core CPU (SmolLM2-135M, batch 16, 188-token prompts; ``torch.profiler``,
see benchmarks/bench_gen.py ``--profile``): 31 % of the time in ``aten::copy_`` (bf16 autocast
casting every fp32 weight, the 28M-parameter LM head included, at every step), 13 % in
``aten::cat`` (the dynamic cache growing), a prompt encoded once per sample although its J samples
share it, the whole [batch, prompt, vocab] logits computed at prefill, and finished rows kept in
the batch until the longest one ends.  This loop:

- casts the weights to bf16 once (on CPU too) instead of autocasting each step, and merges a LoRA
  adapter into its in-memory copy of the model once per load (no merged checkpoint on disk);
- encodes each distinct prompt of a batch once and shares its KV cache with the batch's rows of
  that prompt (``batch_select_indices`` with repeated indices);
- computes logits for the last position only (``logits_to_keep=1``);
- drops a row from the batch (and its cache) as soon as it is finished: at an end-of-sequence
  token, or at a token that can end the stop marker once the row's decoded tail holds the marker
  (token ids first, text only for the rare candidates);
- samples on the device by the inverse CDF: softmax and its cumulative sum in float32 (the
  ``generate`` path's float64 CDF and a one-hot logits tensor per step are gone), top-p by one
  sort, one uniform per row per step from the row's own generator (an exponential race,
  ``argmax(p / E)``, needs a vocabulary of draws per row: 21 % of the loop's time in the
  profile).  Each row keeps the generator seeded from
  ``(seed, attempt, prompt_id, sample_idx)``, so in fp32 a row's sample does not depend on the
  batch it lands in; in bf16 the rounding of a batched matmul can (seeded reruns with the same
  batch size on one machine are byte-identical; README).

This loop is the CPU default, and its samples stay byte-identical there.  On CUDA the default
is the slot engine of :mod:`popri.models.slots` (issue 38: static cache, continuous batching,
CUDA graphs, the counter-based sampler of :mod:`popri.models.sampling`); :class:`DecodeOptions`
chooses either on either device, and :func:`attention_policy` keeps cuDNN's attention out of
decoding on CUDA (the loop's too).  The samplers moved to :mod:`popri.models.sampling`; their
names stay importable from here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, replace
from typing import Sequence

# the samplers live in popri.models.sampling (issue 38's split); these names stay importable here
from popri.models.sampling import CounterSampler, Sampler, derive_seed  # noqa: F401


def stop_candidates(tok, marker: str) -> list[int]:
    """Token ids that can complete ``marker``: the last token of its encodings after the
    contexts a generation puts before it.  A marker that ends inside a longer token is still
    cut from the text afterwards (:func:`~popri.models.generation.cut_at_marker`); it only
    generates to the token limit."""
    ids = set()
    for pre in ("", " ", "\n", "\n\n", ". ", ".\n", ":\n"):
        enc = tok(pre + marker, add_special_tokens=False)["input_ids"]
        if enc:
            ids.add(int(enc[-1]))
    return sorted(ids)


@functools.lru_cache(maxsize=None)
def accepts(model_class: type, name: str) -> bool:
    """Whether ``model_class.forward`` takes ``name`` (once per class, not per batch)."""
    try:
        return name in inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):
        return False


def decode_batch(model, tok, prompts: Sequence[str], sampler: Sampler, *, max_new_tokens: int,
                 marker: str, eos_ids: Sequence[int], stop_ids: Sequence[int],
                 autocast=None) -> list[tuple[str, int]]:
    """Sample one continuation per prompt (rows with equal prompts share its prefill) ->
    ``[(text, generated tokens)]`` in the order of ``prompts``."""
    import contextlib

    torch = sampler.torch
    dev = model.device
    uniq: dict[str, int] = {}
    inv = [uniq.setdefault(p, len(uniq)) for p in prompts]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        enc = tok(list(uniq), return_tensors="pt", padding=True).to(dev)
    finally:
        tok.padding_side = side
    attn = enc["attention_mask"]
    pos = (attn.long().cumsum(-1) - 1).clamp_(min=0)
    extra = {"logits_to_keep": 1} if accepts(type(model), "logits_to_keep") else {}
    # transformers 5.x names the cache argument and output `cache`, 4.x `past_key_values`
    ckey = "cache" if accepts(type(model), "cache") else "past_key_values"
    n = len(prompts)
    out_ids = torch.zeros((n, max_new_tokens), dtype=torch.long)
    lens = [0] * n
    window = len(tok(marker, add_special_tokens=False)["input_ids"]) + 4
    stop_t = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=dev)
    eos_t = torch.tensor(sorted(set(i for i in eos_ids if i is not None)), dtype=torch.long,
                         device=dev)
    counted = [0] * n  # tokens generated, an end-of-sequence token not counted
    ctx = autocast if autocast is not None else contextlib.nullcontext()
    with torch.inference_mode(), ctx:
        res = model(input_ids=enc["input_ids"], attention_mask=attn, position_ids=pos,
                    use_cache=True, **extra)
        cache = res[ckey]
        idx = torch.tensor(inv, dtype=torch.long, device=dev)
        if len(uniq) != n or inv != list(range(n)):
            cache.batch_select_indices(idx)
        logits = res.logits[:, -1][idx]
        attn, nxt = attn[idx], pos[:, -1][idx] + 1
        alive = list(range(n))
        for step in range(max_new_tokens):
            toks = sampler.draw(logits, alive)
            host = toks.tolist()
            eos_l = torch.isin(toks, eos_t).tolist()
            maybe_l = torch.isin(toks, stop_t).tolist()
            keep = []
            for i, r in enumerate(alive):
                out_ids[r, step] = host[i]
                lens[r] = step + 1
                if eos_l[i]:
                    continue
                counted[r] += 1
                if maybe_l[i]:
                    tail = out_ids[r, max(0, step + 1 - window):step + 1]
                    if marker in tok.decode(tail, skip_special_tokens=True):
                        continue
                keep.append(i)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) != len(alive):
                k = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(k)
                attn, nxt, toks = attn[k], nxt[k], toks[k]
                alive = [alive[i] for i in keep]
            attn = torch.cat([attn, attn.new_ones((len(alive), 1))], dim=-1)
            res = model(input_ids=toks[:, None], attention_mask=attn,
                        position_ids=nxt[:, None], use_cache=True, **{ckey: cache}, **extra)
            cache, logits, nxt = res[ckey], res.logits[:, -1], nxt + 1
    return [(tok.decode(out_ids[r, :lens[r]], skip_special_tokens=True), counted[r])
            for r in range(n)]


def eos_token_ids(model, tok) -> list[int]:
    gc = getattr(model, "generation_config", None)
    e = getattr(gc, "eos_token_id", None)
    ids = list(e) if isinstance(e, (list, tuple)) else [e]
    return [int(i) for i in ids + [tok.eos_token_id] if i is not None]


# --------------------------------------------------------------------------- options
DECODERS = ("loop", "slots")
CAPTURES = ("none", "graph", "compile", "compile+graph")


@dataclass(frozen=True)
class DecodeOptions:
    """How the ``transformers`` backend decodes; ``"auto"`` resolves by device (:meth:`resolve`).

    - ``decoder``: ``loop`` (:func:`decode_batch`: fixed batches, finished rows dropped; the CPU
      default) or ``slots`` (:mod:`popri.models.slots`: a static KV cache of ``batch_size``
      slots, a finished row's slot refilled by a waiting row; the CUDA default);
    - ``sampler``: ``generator`` (:class:`~popri.models.sampling.Sampler`, one torch.Generator
      per row; the CPU default, whose samples the CPU path keeps byte-identical) or ``counter``
      (:func:`~popri.models.sampling.draw_counter`, Philox keyed by (row seed, step): the CUDA
      default; the ``slots`` engine always uses it);
    - ``capture`` (``slots`` only): ``graph`` (the decode step captured in a CUDA graph, one per
      batch bucket; the CUDA default), ``compile`` (``torch.compile`` of the step; also on CPU),
      ``compile+graph`` (CUDA) or ``none`` (eager; the CPU default);
    - ``attention``: ``auto`` keeps cuDNN's SDPA out of decoding on CUDA (it rebuilds a graph
      per call: 47 % of the host time of a batch of 512 on an H200, issue 38) and leaves CPU
      as it is; ``default`` leaves PyTorch's choice alone.
    """

    decoder: str = "auto"
    sampler: str = "auto"
    capture: str = "auto"
    attention: str = "auto"
    refill: float = 0.125  # slots: refill once this share of the batch's slots is free

    def resolve(self, device: str) -> "DecodeOptions":
        cuda = str(device).startswith("cuda")
        decoder = self.decoder if self.decoder != "auto" else ("slots" if cuda else "loop")
        sampler = self.sampler if self.sampler != "auto" else ("counter" if cuda else "generator")
        if decoder == "slots":
            sampler = "counter"
        capture = self.capture if self.capture != "auto" else ("graph" if cuda else "none")
        if decoder == "loop":
            capture = "none"
        if "graph" in capture and not cuda:
            raise ValueError(f"capture {capture!r} needs a CUDA device (this is {device})")
        for name, val, ok in (("decoder", decoder, DECODERS), ("capture", capture, CAPTURES),
                              ("sampler", sampler, ("generator", "counter")),
                              ("attention", self.attention, ("auto", "default"))):
            if val not in ok:
                raise ValueError(f"decode {name} must be one of {', '.join(ok)} (not {val!r})")
        return replace(self, decoder=decoder, sampler=sampler, capture=capture)

    @classmethod
    def parse(cls, text: str | None) -> "DecodeOptions":
        """``"decoder=slots,capture=compile"`` (or ``"slots"``, ``"loop"``) -> options."""
        if not text:
            return cls()
        kw: dict = {}
        for part in str(text).split(","):
            k, _, v = part.strip().partition("=")
            if not v:
                k, v = "decoder", k
            kw[k.strip()] = float(v) if k.strip() == "refill" else v.strip()
        return cls(**kw)


def attention_policy(device: str, policy: str = "auto"):
    """The SDPA backends decoding may use: on CUDA (``auto``) FlashAttention, memory-efficient
    attention and the math kernel, never cuDNN's (``torch.nn.attention.sdpa_kernel``; "the
    bare transformers forward of one decode step at batch 512 takes 66.7 ms with the default
    attention backend and 26.8 ms without cuDNN", issue 38).  CPU: unchanged."""
    if policy != "auto" or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])
