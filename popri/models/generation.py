"""The server LLM writes K prompts x J samples; the one LLM engine factory.

    popri gen data/c4-init.jsonl --prompts 1800 --samples-per-prompt 10 --seed 0 --out r0.jsonl
    python -c "from popri.models.generation import build_prompts; print(build_prompts(['a b', 'c d', 'e f'], 1, seed=0)[0]['prompt'])"

This is Algorithm 1 line 3 of "Private Federated Learning using Preference-Optimized Synthetic
Data" (POPri, arXiv:2504.16438) and the generation inside ``Expand`` of "PrE-Text: Training
Language Models on Private Federated Data in the Age of LLMs" (PrE-Text, arXiv:2406.02958).

Prompts (POPri B.2 / Figure 5, PrE-Text Figure 3, the POPri reference ``generation_prompt.txt``):
each prompt shows ``shots`` (3) distinct, whitespace-normalised texts of the initial population
Omega as "Original Text Sample 1..3" and ends with "Original Text Sample 4"; the model writes
sample 4.  A generation is cut at the next "Original Text Sample" (a partial marker left at the
end by the token limit is dropped too), whitespace-normalised and truncated to ``max_tokens``
tokens of the generator's tokenizer (64, POPri's ``trunc_len``).

Degenerate samples (see :func:`degeneracy`) are regenerated up to ``max_retries`` times; one
still degenerate afterwards is KEPT with ``"degenerate": true`` so that every prompt keeps
exactly J samples (preference pairs need a fixed J).  The settings are a
:class:`~popri.specs.generation.GenSpec` (sampling defaults: the POPri reference code's,
temperature 1.0, top-p 1.0, no top-k, 85 new tokens).

Backends (:func:`make_engine`, the one factory: ``popri gen``, ``popri expand`` and ``popri vary
--method paraphrase`` all load their LLM through it): ``transformers`` (batched, left padding,
bf16 autocast on CPU) and ``vllm`` (GPU, imported lazily; a LoRA adapter is served with
``LoRARequest`` or merged first).  :func:`generate_file` is the whole ``popri gen`` step.
"""

from __future__ import annotations

import json
import math
import re
import string
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from popri.core import log, runtime
from popri.core.errors import InputError, MissingResourceError, PopriError
from popri.specs.generation import MARKER, GeneratorSpec, GenSpec, settle
from popri.models.decoding import derive_seed
from popri.models.lora import merged_checkpoint

DEFAULT_TEMPLATE = (
    "List of 6 diverse original text samples:\n"
    "Original Text Sample 1\n{sample1}\n"
    "Original Text Sample 2\n{sample2}\n"
    "Original Text Sample 3\n{sample3}\n"
    "Original Text Sample 4\n"
)
# degeneracy thresholds (documented in `popri gen --help`)
TOP_WORD_SHARE = 0.5      # one word making up more than half of the words
LOOP_MIN_WORDS = 10       # ... or, from 10 words on,
LOOP_TRIGRAM_SHARE = 0.5  # fewer than half of the word trigrams distinct
COPY_WORDS = 8            # first 8 words found verbatim in the prompt = copied example


def normalise_ws(text: str) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- prompts
def template_fields(template: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


def check_template(template: str, shots: int) -> None:
    """Placeholders must be exactly the shots: ``{sample1}..{sampleN}`` (or ``{0}..{N-1}``)."""
    try:
        fields = template_fields(template)
    except ValueError as e:
        raise InputError(f"malformed template ({e}); write literal braces as {{{{ and }}}}",
                         field="template") from None
    used = set()
    for f in fields:
        m = re.fullmatch(r"sample(\d+)|(\d+)", f)
        if not m:
            raise InputError(f"unknown placeholder {{{f}}}: use {{sample1}}..{{sample{shots}}}",
                             field="template")
        idx = int(m.group(1)) - 1 if m.group(1) else int(m.group(2))
        if not 0 <= idx < shots:
            raise InputError(f"placeholder {{{f}}} is beyond the {shots} shots (--shots)",
                             field="template")
        used.add(idx)
    if len(used) != shots:
        raise InputError(f"template uses {len(used)} of {shots} shots; every one of "
                         f"{{sample1}}..{{sample{shots}}} must appear (or change --shots)",
                         field="template")


def read_template(path: str | None, check) -> str | None:
    """A prompt template from a file (None when no file is given), checked by ``check(text)``;
    any problem is one InputError naming the file."""
    if not path:
        return None
    from pathlib import Path

    if not Path(path).is_file():
        raise InputError("no such file", path=path)
    text = Path(path).read_text(encoding="utf-8")
    try:
        check(text)
    except InputError as e:
        raise InputError(e.message, path=path, field=e.field) from None
    return text


def fill_template(template: str, examples: Sequence[str]) -> str:
    named = {f"sample{i + 1}": ex for i, ex in enumerate(examples)}
    return template.format(*examples, **named)


def build_prompts(omega_texts: Sequence[str], num_prompts: int, *, seed: int,
                  shots: int = GenSpec.shots,
                  template: str | None = None, ids: Sequence | None = None) -> list[dict]:
    """K prompts, each filled with ``shots`` distinct random texts of Omega (seeded).

    Returns ``[{"prompt_id", "prompt", "examples": [ids or indices], "example_texts"}]``.
    Texts are whitespace-normalised (as the reference code does) and de-duplicated, so the
    shots of one prompt are always distinct texts.
    """
    template = DEFAULT_TEMPLATE if template is None else template
    check_template(template, shots)
    if num_prompts < 0 or shots < 1:
        raise ValueError("num_prompts must be >= 0 and shots >= 1")
    seen: dict[str, int] = {}
    for i, t in enumerate(omega_texts):
        n = normalise_ws(t)
        if n and n not in seen:
            seen[n] = i
    pool = list(seen.items())
    if len(pool) < shots:
        raise InputError(f"the initial population has {len(pool)} distinct non-empty texts; "
                         f"each prompt needs {shots}", field="text")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x9E4E]))
    out = []
    for k in range(num_prompts):
        pick = rng.choice(len(pool), size=shots, replace=False)
        texts = [pool[j][0] for j in pick]
        idx = [pool[j][1] for j in pick]
        out.append({"prompt_id": k, "prompt": fill_template(template, texts),
                    "examples": [ids[i] for i in idx] if ids is not None else idx,
                    "example_texts": texts})
    return out


# --------------------------------------------------------------------------- cleaning
def cut_at_marker(raw: str, marker: str = MARKER) -> str:
    """Text before the next ``marker``; a partial marker (>= 4 chars) at the very end goes too."""
    text = raw.split(marker, 1)[0]
    stripped = text.rstrip()
    for k in range(len(marker) - 1, 3, -1):
        if stripped.endswith(marker[:k]):
            before = stripped[:-k]
            if not before or before[-1].isspace():
                return before
    return text


def truncate_tokens(text: str, tokenizer, max_tokens: int) -> str:
    """At most ``max_tokens`` tokens of ``tokenizer``, cut on the original characters."""
    if tokenizer is not None and max_tokens > 0:  # a long text is cut first (same result)
        from popri.data.tokenize import hf_counter, prefix_for_tokens

        text = prefix_for_tokens(text, max_tokens, hf_counter(tokenizer))
    if tokenizer is None or max_tokens <= 0:
        return text
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError):  # slow tokenizer: the reference's way
        toks = tokenizer.tokenize(text)
        return text if len(toks) <= max_tokens else tokenizer.convert_tokens_to_string(
            toks[:max_tokens]).strip()
    if len(ids) <= max_tokens:
        return text
    out = text[:offsets[max_tokens - 1][1]].rstrip()
    # a BPE can re-merge differently at the cut: shrink until it fits
    while out and len(tokenizer(out, add_special_tokens=False)["input_ids"]) > max_tokens:
        out = out[:-1].rstrip()
    return out


def clean_generation(raw: str, tokenizer, max_tokens: int, marker: str = MARKER) -> str:
    """Cut at the next marker, normalise whitespace, truncate to ``max_tokens`` tokens."""
    return normalise_ws(truncate_tokens(normalise_ws(cut_at_marker(raw, marker)), tokenizer,
                                        max_tokens))


# --------------------------------------------------------------------------- degeneracy
def _words(text: str) -> list[str]:
    return [w for w in text.split() if any(c.isalnum() for c in w)]


def _key(w: str) -> str:
    return w.casefold().strip(string.punctuation + "“”‘’«»")


def degeneracy(text: str, *, min_words: int = GenSpec.min_words, prompt: str = "",
               examples: Sequence[str] = ()) -> str | None:
    """Why ``text`` is degenerate, or None.

    - ``empty``: nothing left after cleaning;
    - ``short``: fewer than ``min_words`` words (a word has a letter or digit);
    - ``repetitive``: one word is more than half of the words, or (from 10 words on) fewer than
      half of the word trigrams are distinct (a loop);
    - ``copy``: equals one of the prompt's examples, or its first 8 words appear verbatim in the
      prompt (case- and whitespace-insensitive).
    """
    if not text.strip():
        return "empty"
    words = _words(text)
    if len(words) < min_words:
        return "short"
    keys = [_key(w) for w in words]
    if keys and Counter(keys).most_common(1)[0][1] > TOP_WORD_SHARE * len(keys):
        return "repetitive"
    if len(keys) >= LOOP_MIN_WORDS:
        tri = list(zip(keys, keys[1:], keys[2:]))
        if len(set(tri)) < LOOP_TRIGRAM_SHARE * len(tri):
            return "repetitive"
    low = " ".join(text.casefold().split())
    if any(low == " ".join(e.casefold().split()) for e in examples):
        return "copy"
    if prompt and len(words) >= COPY_WORDS:
        toks = low.split()
        needle = " ".join(toks[:COPY_WORDS])
        if f" {needle} " in f" {' '.join(prompt.casefold().split())} ":
            return "copy"
    return None


# --------------------------------------------------------------------------- seeds
# --------------------------------------------------------------------------- backends
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
        from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                            TopPLogitsWarper)

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


class MarkerStop:
    """Stopping criterion: a row is done once ``marker`` appears in its newly generated tokens
    (decodes only the last few new tokens per step; the prompt's own markers are not looked at)."""

    def __init__(self, tok, marker: str, prompt_len: int):
        self.tok, self.marker, self.prompt_len = tok, marker, prompt_len
        self.window = len(tok(marker, add_special_tokens=False)["input_ids"]) + 4

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        tail = input_ids[:, self.prompt_len:][:, -self.window:]
        hits = [self.marker in t for t in self.tok.batch_decode(tail, skip_special_tokens=True)]
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)


class TransformersBackend:
    """Batched in-process generation with transformers: by default the sampling loop of
    :mod:`popri.models.decoding` (``loop=True``: bf16 weights cast once, shared-prompt prefill,
    finished rows dropped, sampling on the device); ``loop=False`` is ``model.generate`` with
    left padding, bf16 autocast on CPU, :class:`RowSampler` and :class:`MarkerStop` (backend
    ``transformers-generate``: any model ``generate`` supports; the benchmark's baseline).
    Both seed every row from ``(seed, attempt, prompt_id, sample_idx)``."""

    name = "transformers"

    def __init__(self, model: str, adapter: str | None, *, device: str | None, bf16: bool,
                 params: dict, batch_size: int, seed: int, marker: str, model_obj=None,
                 tokenizer_obj=None, loop: bool = True):
        from popri.models import llm

        self.torch = runtime.configure_torch()
        self.loop = loop
        self.name = "transformers" if loop else "transformers-generate"
        if model_obj is None:
            self.device = device or llm.default_device()
            dtype = "bfloat16" if bf16 and self.device.startswith("cuda") else "float32"
            model_obj, tok = llm.load_causal_lm(model, adapter, dtype=dtype, device=self.device)
            tokenizer_obj = tokenizer_obj or tok
            if loop and adapter and hasattr(model_obj, "merge_and_unload"):
                model_obj = model_obj.merge_and_unload()  # in memory, once per load
            if loop and llm.use_bf16(bf16, self.device) and not self.device.startswith("cuda"):
                model_obj = model_obj.to(self.torch.bfloat16)  # cast once, not every step
        else:
            self.device = str(getattr(model_obj, "device", device or "cpu"))
            if tokenizer_obj is None:
                tokenizer_obj = llm.load_tokenizer(model)
        if tokenizer_obj.pad_token is None:
            tokenizer_obj.pad_token = tokenizer_obj.eos_token
        self.model, self.tok = model_obj, tokenizer_obj
        # autocast where the weights are fp32 (a CPU model not loaded here, or the generate
        # path); bf16 weights need none
        weights = next(iter(self.model.parameters())).dtype
        self.autocast = llm.use_bf16(bf16, self.device) and weights == self.torch.float32
        self.batch_size, self.seed, self.marker, self.params = batch_size, seed, marker, params
        from transformers import GenerationConfig

        gc = getattr(self.model, "generation_config", None)
        # greedy decoding over RowSampler's one-hot logits = sampling (see RowSampler)
        self.gen_config = GenerationConfig(
            do_sample=False, num_beams=1, max_new_tokens=params["max_new_tokens"],
            num_return_sequences=1, repetition_penalty=1.0, pad_token_id=self.tok.pad_token_id,
            eos_token_id=getattr(gc, "eos_token_id", None) or self.tok.eos_token_id,
            bos_token_id=getattr(gc, "bos_token_id", None))
        if loop:
            from popri.models import decoding

            self.eos_ids = decoding.eos_token_ids(self.model, self.tok)
            self.stop_ids = decoding.stop_candidates(self.tok, marker)

    def run(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int, tick) -> list[tuple[str, int]]:
        if not self.loop:
            return self.run_generate(prompts, keys, attempt, tick)
        from popri.models import decoding, llm

        out: list[tuple[str, int]] = []
        p = self.params
        for s in range(0, len(prompts), self.batch_size):
            chunk = prompts[s:s + self.batch_size]
            seeds = [derive_seed(self.seed, attempt, *k) for k in keys[s:s + len(chunk)]]
            sampler = decoding.Sampler(p["temperature"], p["top_p"], seeds, self.model.device)
            res = decoding.decode_batch(
                self.model, self.tok, chunk, sampler, max_new_tokens=p["max_new_tokens"],
                marker=self.marker, eos_ids=self.eos_ids, stop_ids=self.stop_ids,
                autocast=llm.autocast(self.device, self.autocast) if self.autocast else None)
            out.extend(res)
            tick(len(chunk), sum(n for _, n in res))
        return out

    def run_generate(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int,
                     tick) -> list[tuple[str, int]]:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from popri.models import llm

        torch = self.torch
        out: list[tuple[str, int]] = []
        side = self.tok.padding_side
        self.tok.padding_side = "left"
        try:
            for s in range(0, len(prompts), self.batch_size):
                chunk = prompts[s:s + self.batch_size]
                enc = self.tok(chunk, return_tensors="pt", padding=True).to(self.model.device)
                plen = enc["input_ids"].shape[1]
                procs = LogitsProcessorList()
                if self.params["temperature"] > 0:
                    seeds = [derive_seed(self.seed, attempt, *k) for k in keys[s:s + len(chunk)]]
                    procs.append(RowSampler(self.params["temperature"], self.params["top_p"],
                                            seeds, self.model.device))
                with torch.inference_mode(), llm.autocast(self.device, self.autocast):
                    gen = self.model.generate(
                        **enc, generation_config=self.gen_config, logits_processor=procs,
                        stopping_criteria=StoppingCriteriaList([MarkerStop(self.tok, self.marker,
                                                                           plen)]))
                new = gen[:, plen:]
                pad = self.tok.pad_token_id
                for row in new:
                    n = int((row != pad).sum()) if pad is not None else int(row.numel())
                    out.append((self.tok.decode(row, skip_special_tokens=True), n))
                tick(len(chunk), sum(n for _, n in out[-len(chunk):]))
        finally:
            self.tok.padding_side = side
        return out


def _import_vllm():
    try:
        import vllm  # noqa: F401
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise MissingResourceError(
            f"backend 'vllm' needs the vllm package on a CUDA machine ({e}); install it with "
            "`pip install 'popri[gpu]'` or use --backend transformers") from None
    return LLM, SamplingParams


def adapter_rank(adapter: str) -> int:
    """The LoRA rank ``r`` of a PEFT adapter directory (vllm's ``max_lora_rank`` must cover it)."""
    from popri.models.llm import ADAPTER_CONFIG, require_adapter

    cfg = require_adapter(adapter) / ADAPTER_CONFIG
    try:
        return int(json.loads(cfg.read_text(encoding="utf-8")).get("r", 8))
    except (ValueError, TypeError) as e:
        raise InputError(f"unreadable adapter config: {e}", path=str(cfg), field="r") from None


class VllmBackend:
    """vLLM offline engine; one SamplingParams per row with seed
    ``derive_seed(seed, attempt, prompt_id, sample_idx)``, so samples do not depend on batching.
    ``adapter_mode='lora'`` serves the adapter with a LoRARequest; ``'merge'`` merges it first.
    ``.tok``: the tokenizer (``tokenizer_obj``) the caller truncates samples with."""

    name = "vllm"

    def __init__(self, model: str, adapter: str | None, *, bf16: bool, params: dict, seed: int,
                 marker: str, adapter_mode: str = "lora", max_model_len: int | None = None,
                 model_obj=None, tokenizer_obj=None):
        from popri.models import llm

        LLM, self.SamplingParams = _import_vllm()
        self.params, self.seed, self.marker, self.tok = params, seed, marker, tokenizer_obj
        self.lora = None
        path = llm.resolve(model)
        kwargs: dict = {}
        if adapter and adapter_mode == "merge":
            path = merged_checkpoint(model, adapter)
        elif adapter:
            from vllm.lora.request import LoRARequest

            r = adapter_rank(adapter)
            self.lora = LoRARequest("popri-adapter", 1, str(Path(adapter).resolve()))
            kwargs.update(enable_lora=True, max_loras=1,
                          max_lora_rank=next(b for b in (8, 16, 32, 64, 128, 256, 512, r) if b >= r))
        if model_obj is not None:
            self.llm = model_obj
        else:
            self.llm = LLM(model=path, seed=seed, dtype="bfloat16" if bf16 else "auto",
                           max_model_len=max_model_len, **kwargs)

    def sampling_params(self, key: tuple[int, int], attempt: int):
        p = self.params
        return self.SamplingParams(n=1, temperature=p["temperature"], top_p=p["top_p"],
                                   max_tokens=p["max_new_tokens"], stop=[self.marker],
                                   seed=derive_seed(self.seed, attempt, *key))

    def run(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int, tick) -> list[tuple[str, int]]:
        sps = [self.sampling_params(k, attempt) for k in keys]
        outs = self.llm.generate(prompts, sampling_params=sps, lora_request=self.lora,
                                 use_tqdm=False)
        res = [(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outs]
        if len(res) != len(prompts):
            raise PopriError(f"vllm returned {len(res)} outputs for {len(prompts)} prompts")
        tick(len(prompts), sum(n for _, n in res))
        return res


def sampling_params(spec) -> dict:
    """What a backend samples with: temperature, top-p, new tokens (no top-k)."""
    return {"temperature": float(spec.temperature), "top_p": float(spec.top_p),
            "max_new_tokens": int(spec.max_new_tokens)}


def make_engine(spec: GeneratorSpec, *, adapter: str | None = None, seed: int = 0,
                marker: str = MARKER, device: str | None = None, model_obj=None,
                tokenizer_obj=None, max_model_len: int | None = None,
                prompt_tokens: Callable | None = None):
    """THE generation backend: ``spec.backend`` serving ``spec.model`` (+ the LoRA ``adapter``),
    sampling with ``spec``'s temperature / top-p / new tokens, every row seeded from ``seed``,
    stopping at ``marker``.  Used by :func:`generate` (``popri gen``, the paraphrase of ``popri
    vary``) and ``popri expand``; loaded once and reused for every batch.

    The engine has ``run(prompts, keys, attempt, tick) -> [(text, n_tokens)]``, ``name`` and
    ``.tok`` (its tokenizer, for truncation to ``max_tokens``).  ``model_obj`` /
    ``tokenizer_obj`` reuse a loaded model (an ``vllm.LLM`` for vllm).  vllm: a missing package
    is reported before any model is fetched; its context is ``max_model_len``, else the longest
    prompt (``prompt_tokens(tokenizer)`` tokens) + ``max_new_tokens``, rounded up to 64."""
    params = sampling_params(spec)
    if spec.backend == "openai":
        from popri.models import remote

        remote.check_url(spec.base_url)
        return remote.OpenAIBackend(
            spec.model, adapter, base_url=spec.base_url, params=params, seed=seed, marker=marker,
            adapter_mode=spec.adapter_mode, api=spec.api, api_key_env=spec.api_key_env,
            concurrency=spec.concurrency, tokenizer_obj=tokenizer_obj)
    if spec.backend == "vllm":
        _import_vllm()
        from popri.models import llm

        tok = tokenizer_obj or llm.load_tokenizer(spec.model)
        if max_model_len is None and model_obj is None and prompt_tokens is not None:
            max_model_len = 64 * math.ceil((prompt_tokens(tok) + spec.max_new_tokens) / 64)
        return VllmBackend(spec.model, adapter, bf16=spec.bf16, params=params, seed=seed,
                           marker=marker, adapter_mode=spec.adapter_mode,
                           max_model_len=max_model_len, model_obj=model_obj, tokenizer_obj=tok)
    return TransformersBackend(spec.model, adapter, device=device, bf16=spec.bf16, params=params,
                               batch_size=spec.batch_size, seed=seed, marker=marker,
                               model_obj=model_obj, tokenizer_obj=tokenizer_obj,
                               loop=spec.backend != "transformers-generate")


# --------------------------------------------------------------------------- driver
def generate(prompts: list[dict], spec: GenSpec | None = None, *, adapter: str | None = None,
             round_no: int = 0, seed: int = 0, device: str | None = None, model_obj=None,
             tokenizer_obj=None, num_samples: int | None = None,
             max_model_len: int | None = None, clean=None, **settings) -> tuple[list[dict], dict]:
    """Sample ``spec.samples_per_prompt`` texts per prompt -> (records, stats).

    ``spec``: a :class:`~popri.specs.generation.GenSpec` (default: its defaults); its fields may
    also be given as keywords (``generate(prompts, model="smollm2-135m", temperature=0.7)``).
    Records (ordered by prompt, then sample): ``{"id": "r{round_no}-p{prompt_id}-s{sample_idx}",
    "round", "prompt_id", "sample_idx", "prompt", "text", "model"}`` plus ``"adapter"`` when one
    is used and ``"degenerate": true`` for a sample still degenerate after ``max_retries``.
    ``num_samples`` keeps only the first N of the K*J grid.  ``model_obj``/``tokenizer_obj``
    reuse a loaded model (an ``vllm.LLM`` for the vllm backend).  ``clean(raw, tokenizer,
    max_tokens, marker)`` replaces :func:`clean_generation` (the degeneracy check sees its result).
    """
    spec = settle(GenSpec, spec, settings)
    J, marker, max_tokens = spec.samples_per_prompt, spec.marker, spec.max_tokens
    rows = [(i, j) for i in range(len(prompts)) for j in range(J)]
    if num_samples is not None:
        rows = rows[:num_samples]
    t_load = time.perf_counter()
    engine = make_engine(
        spec, adapter=adapter, seed=seed, marker=marker, device=device, model_obj=model_obj,
        tokenizer_obj=tokenizer_obj, max_model_len=max_model_len,
        prompt_tokens=lambda tok: max((len(tok(p["prompt"])["input_ids"]) for p in prompts),
                                      default=0))
    tok = engine.tok
    load_s = time.perf_counter() - t_load

    texts: dict[tuple[int, int], str] = {}
    why: dict[tuple[int, int], str | None] = {}
    first_reasons: Counter = Counter()
    totals = {"generated": 0, "tokens": 0, "seconds": 0.0}
    todo = rows
    for attempt in range(spec.max_retries + 1):
        if not todo:
            break
        with log.progress() as prog:
            task = prog.add_task("gen" if attempt == 0 else f"regen {attempt}", total=len(todo))
            t0 = time.perf_counter()
            done = {"tokens": 0}

            def tick(n_rows: int, n_tokens: int) -> None:
                done["tokens"] += n_tokens
                rate = done["tokens"] / max(time.perf_counter() - t0, 1e-9)
                prog.update(task, advance=n_rows,
                            description=f"{'gen' if attempt == 0 else f'regen {attempt}'} "
                                        f"{rate:,.0f} tok/s")

            keys = [(int(prompts[i]["prompt_id"]), j) for i, j in todo]
            raw = engine.run([prompts[i]["prompt"] for i, _ in todo], keys, attempt, tick)
            totals["seconds"] += time.perf_counter() - t0
        totals["generated"] += len(todo)
        totals["tokens"] += sum(n for _, n in raw)
        again = []
        for row, (r, _) in zip(todo, raw):
            p = prompts[row[0]]
            text = (clean or clean_generation)(r, tok, max_tokens, marker)
            reason = degeneracy(text, min_words=spec.min_words, prompt=p["prompt"],
                                examples=p.get("example_texts", ()))
            if attempt == 0 and reason:
                first_reasons[reason] += 1
            # keep the newest candidate unless it is empty and an earlier one was not
            if row not in texts or text or not texts[row]:
                texts[row], why[row] = text, reason
            if reason:
                again.append(row)
        todo = again

    records = []
    for i, j in rows:
        p = prompts[i]
        pid = int(p["prompt_id"])
        rec = {"id": f"r{round_no}-p{pid}-s{j}", "round": int(round_no), "prompt_id": pid,
               "sample_idx": j, "prompt": p["prompt"], "text": texts[(i, j)], "model": spec.model}
        if adapter:
            rec["adapter"] = str(adapter)
        if why[(i, j)]:
            rec["degenerate"] = True
        records.append(rec)
    kept = Counter(r for r in why.values() if r)
    stats = {
        "backend": spec.backend, "model": spec.model, "adapter": adapter, "round": int(round_no),
        "prompts": len(prompts), "samples_per_prompt": J,
        "samples": len(records), "generated": totals["generated"],
        "regenerated": totals["generated"] - len(rows),
        "degenerate_first_pass": sum(first_reasons.values()),
        "degenerate_first_pass_reasons": dict(sorted(first_reasons.items())),
        "kept_degenerate": sum(kept.values()), "kept_degenerate_reasons": dict(sorted(kept.items())),
        "generated_tokens": totals["tokens"], "seconds": round_(totals["seconds"]),
        "load_seconds": round_(load_s),
        "tokens_per_s": round_(totals["tokens"] / totals["seconds"]) if totals["seconds"] else None,
        "samples_per_s": round_(totals["generated"] / totals["seconds"]) if totals["seconds"] else None,
        "params": {**sampling_params(spec), "top_k": None, "max_tokens": max_tokens,
                   "min_words": spec.min_words, "max_retries": spec.max_retries,
                   "batch_size": spec.batch_size, "seed": seed, "bf16": spec.bf16,
                   "marker": marker},
    }
    return records, stats


def generate_file(omega: str, spec: GenSpec, *, prompts: int | None = None,
                  num_samples: int | None = None, out: str = "-", split: str = "train",
                  template: str | None = None, adapter: str | None = None, seed: int = 0,
                  round_no: int = 0, device: str | None = None, prompts_out: str | None = None,
                  stats_out: str | None = None) -> dict:
    """The ``popri gen`` step: K = ``prompts`` few-shot prompts (or K = ceil(``num_samples`` /
    J), the first N samples kept) from the texts of ``omega`` (JSONL, a dataset directory's
    ``split``, or '-'), J samples each -> JSONL at ``out`` ('-': stdout), the prompts at
    ``prompts_out``, the stats at ``stats_out`` (all written atomically, after every input
    check).  Returns the stats (counts, timings, ``omega``)."""
    from popri.core.guard import check_outputs
    from popri.core.io import STDIO, AtomicOutputs, dumps, write_jsonl
    from popri.data.records import text_records

    if (prompts is None) == (num_samples is None):
        raise InputError("give exactly one of --prompts K and --num-samples N", field="prompts")
    if adapter:
        from popri.models.lora import require_adapter

        require_adapter(adapter)
    for name, dest in (("prompts-out", prompts_out), ("stats-out", stats_out)):
        if dest == STDIO:
            raise InputError("stdout carries the samples; give a file name", field=name)
    check_outputs([out, prompts_out, stats_out],
                  [omega, template, adapter, spec.model if Path(spec.model).exists() else None])
    tmpl = read_template(template, lambda t: check_template(t, spec.shots))

    recs, src = text_records(omega, split)
    k = prompts if prompts is not None else math.ceil(num_samples / spec.samples_per_prompt)
    try:
        plist = build_prompts([r["text"] for r in recs], k, seed=seed, shots=spec.shots,
                              template=tmpl, ids=[r["id"] for r in recs])
    except InputError as e:
        raise InputError(e.message, path=src, field=e.field) from None
    records, stats = generate(plist, spec, adapter=adapter, round_no=round_no, seed=seed,
                              device=device, num_samples=num_samples)
    stats["omega"] = {"path": src, "texts": len(recs), "shots": spec.shots,
                      "template": template or "builtin"}
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in records)
        if prompts_out:
            with open(staged.path(prompts_out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps({"prompt_id": p["prompt_id"], "prompt": p["prompt"],
                                     "examples": p["examples"]}) + "\n" for p in plist)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(records, STDIO)
    return stats


def round_(x: float, nd: int = 3) -> float:
    return float(f"{x:.{nd}f}") if math.isfinite(x) else x
