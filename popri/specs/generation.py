"""Settings of the text-generation steps: ``popri gen``, ``popri vary`` and ``popri expand``.

    popri gen data/c4-init.jsonl -K 1800 -J 10 --temperature 1.0 --top-p 1.0 --out r0.jsonl
    python -c "from popri.specs.generation import GenSpec; print(GenSpec(temperature=0.7))"

``popri gen`` is the server LLM of "Private Federated Learning using Preference-Optimized
Synthetic Data" (POPri, arXiv:2504.16438), Algorithm 1 line 3; ``popri vary`` and ``popri expand``
are Variation and Expand of "PrE-Text: Training Language Models on Private Federated Data in the
Age of LLMs" (PrE-Text, arXiv:2406.02958), Algorithm 1 lines 9 and 11.  Sampling defaults are the
POPri reference code's (``vllm_sampling``: temperature 1.0, top-p 1.0, no top-k, 85 new tokens)
and PrE-Text D.2's (top-p 1.0, temperature 1.0); samples are 64 tokens (POPri's ``trunc_len``,
PrE-Text's ``seq_len``).

A field two steps share is declared once, in the mixin both inherit:

    SamplingSpec   temperature, top_p, max_new_tokens, max_tokens, batch_size, bf16   gen vary expand
    FilterSpec     min_words, max_retries (the degeneracy filter)                      gen vary
    GeneratorSpec  SamplingSpec + model, backend, adapter_mode                         gen expand
    GenSpec        GeneratorSpec + FilterSpec + samples_per_prompt, shots, marker      popri gen
    VarySpec       SamplingSpec + FilterSpec + method, model, variations, ...          popri vary
    ExpandSpec     GeneratorSpec + min_words + shard_size, attempt_factor              popri expand

``GeneratorSpec`` holds exactly the generator settings ``popri run``'s ``generator:`` section has.
A step whose default differs from the mixin's (vary's batch of 16, expand's backend-dependent
batch and its 4-word filter) re-declares only the default (:func:`popri.core.spec.same`): help,
source and range stay the mixin's.  ``pe init`` / ``pe draw`` / ``pe seeds`` have no settings (sizes, seeds,
rounds and paths only), hence no spec.

Pure Python (no torch / numpy), as every spec module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from popri.core.errors import ConfigError
from popri.core.spec import Spec, param, same

#: the generation backends (``--backend``)
BACKENDS = ("transformers", "transformers-generate", "vllm", "openai")
#: popri's decoders (popri.models.decoding.DecodeOptions.decoder), besides "auto" = unset
DECODERS = ("loop", "slots")
#: the OpenAI-compatible endpoints the ``openai`` backend can call (``--api``)
APIS = ("completions", "chat")
#: how a vllm backend serves a LoRA adapter (``--adapter-mode``)
ADAPTER_MODES = ("lora", "merge")
#: the few-shot prompt's sample marker (POPri Figure 5, PrE-Text Figure 3): generations are cut
#: (and stop) at the next one
MARKER = "Original Text Sample"
#: the offline causal LM (SmolLM2-135M-Instruct, :mod:`popri.models.llm`): generator, paraphraser,
#: variation fallback
DEFAULT_LM = "smollm2-135m"
#: PrE-Text section 4 / D.2: the masked LM of the mask-fill variation
MLM_DEFAULT = "roberta-large"
#: variation methods: PrE-Text's mask-fill, Aug-PE's LLM paraphrase
VARY_METHODS = ("mask-fill", "paraphrase")
#: mask-fill: all masks of a step from one forward pass, or one per pass (PrE-Text's code)
FILL_MODES = ("parallel", "sequential")

_REF = "POPri reference code; PrE-Text D.2"


@dataclass(frozen=True)
class SamplingSpec(Spec):
    """How a causal LM samples and how its samples are cut: shared by gen, vary and expand."""

    temperature: float = param(1.0, "Sampling temperature; 0 = greedy (argmax). POPri E.3's "
                               "ablation picks 1.0.", cite=_REF, lo=0)
    top_p: float = param(1.0, "Nucleus sampling (top-p).", cite=_REF, lo=0, hi=1, lo_open=True)
    max_new_tokens: int = param(85, "Tokens generated per sample.",
                                cite="POPri reference code; PrE-Text's expansion script", lo=1)
    max_tokens: int = param(64, "Samples are truncated to this many tokens of the model's "
                            "tokenizer (the 64-token chunks of the private data).",
                            cite="POPri trunc_len; PrE-Text seq_len", lo=1)
    batch_size: int = param(24, "Sequences per forward pass (transformers; the openai backend: "
                            "rows per call). Each sequence has its own seeded sampler, so with "
                            "--no-bf16 it does not change the samples (bf16 rounding can). 24: "
                            "the fastest on 2 CPU cores (benchmarks/bench_gen.py); 64-256 on a "
                            "GPU.", lo=1)
    bf16: bool = param(True, "bf16 weights, cast once (CPU and GPU; transformers-generate: "
                       "autocast on CPU); vllm: bf16.")


#: ``popri expand``'s prompts per engine call when --batch-size is not given, by backend: the
#: sampling batch on transformers, a large batch for vllm's scheduler, rows per call for openai
EXPAND_BATCH = {"transformers": SamplingSpec.batch_size,
                "transformers-generate": SamplingSpec.batch_size, "vllm": 2048, "openai": 256}


@dataclass(frozen=True)
class FilterSpec(Spec):
    """The degeneracy filter of generated text (:func:`popri.models.generation.degeneracy`):
    shared by gen and vary's paraphrase (expand drops instead of regenerating)."""

    min_words: int = param(3, "Samples with fewer words are degenerate.", lo=0)
    max_retries: int = param(2, "Regenerations of a degenerate sample (then it is kept, flagged "
                             "\"degenerate\": true).", lo=0)


@dataclass(frozen=True)
class GeneratorSpec(SamplingSpec):
    """The server LLM (POPri: LLaMA-3-8B; PrE-Text D.2: LLaMA-2-7B; offline default
    SmolLM2-135M-Instruct): ``popri run``'s ``generator:`` section, shared by gen and expand."""

    model: str = param(DEFAULT_LM, "Generator: alias smollm2-135m / gemma3-270m (offline), a "
                       "local checkpoint or a hub id (POPri used LLaMA-3-8B, PrE-Text D.2 "
                       "meta-llama/Llama-2-7b-hf).", short="-m", envvar="POPRI_GEN_MODEL",
                       nonempty=True)
    backend: str = param("transformers", "transformers (CPU/GPU: popri's batched sampling "
                         "loop), transformers-generate (model.generate: any model it supports; "
                         "slower), vllm (GPU, in-process; pip install 'popri\\[gpu]'; the engine "
                         "of the POPri reference code and PrE-Text D.2), or openai (an "
                         "OpenAI-compatible server at --base-url: vLLM, SGLang, transformers "
                         "serve, llama.cpp).", choices=BACKENDS)
    adapter_mode: str = param("lora", "How a LoRA adapter is served. vllm: 'lora' serves it with "
                              "a LoRARequest, 'merge' merges it into the model first (cached). "
                              "openai: 'lora' loads it into the server (vLLM "
                              "/v1/load_lora_adapter, server started with --enable-lora) and "
                              "asks for it by name; 'merge' asks the server for the merged "
                              "checkpoint's path (servers that load models by path, e.g. "
                              "transformers serve, on a shared filesystem).",
                              choices=ADAPTER_MODES)
    base_url: str | None = param(None, "openai: the server's API root, e.g. "
                                 "http://127.0.0.1:8000/v1.")
    api_key_env: str | None = param(None, "openai: the environment variable holding the API "
                                    "key (default OPENAI_API_KEY; none set: no key).")
    api: str | None = param(None, "openai: completions (the few-shot prompt as is; default) or "
                            "chat (the prompt as one user message, for chat-only servers).",
                            choices=APIS)
    concurrency: int | None = param(None, "openai: requests in flight at once (default 8); "
                                    "429 / 5xx answers are retried with backoff.", lo=1)
    decoder: str | None = param(None, "transformers: how popri's loop decodes. loop: fixed "
                                "batches, finished rows dropped, one torch.Generator per row "
                                "(the CPU default). slots: a static KV cache of --batch-size "
                                "slots, a finished row's slot refilled by a waiting row, the "
                                "decode step in a CUDA graph, a counter-based sampler keyed by "
                                "(row seed, step) (the CUDA default; on CPU without the graph). "
                                "Unset: by device (docs/gpu.md).", choices=DECODERS)

    def check(self) -> None:
        remote = (self.base_url, self.api_key_env, self.api, self.concurrency)
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("the openai backend needs the server's URL (--base-url, e.g. "
                              "http://127.0.0.1:8000/v1)", field="base_url")
        if self.decoder is not None and self.backend != "transformers":
            raise ConfigError(f"applies to the transformers backend (popri's loop); the backend "
                              f"is {self.backend!r}", field="decoder")
        if self.backend != "openai" and any(v is not None for v in remote):
            raise ConfigError(f"is an openai-backend setting; the backend is {self.backend!r}",
                              field=next(n for n, v in zip(
                                  ("base_url", "api_key_env", "api", "concurrency"), remote)
                                  if v is not None))


@dataclass(frozen=True)
class GenSpec(FilterSpec, GeneratorSpec):
    """``popri gen``: J samples for each of K few-shot prompts (POPri Algorithm 1 line 3, B.2).
    K / N (how many) are arguments of the call, not settings."""

    samples_per_prompt: int = param(10, "J samples per prompt.", cite="POPri B.1", short="-J",
                                    lo=1)
    shots: int = param(3, "Omega examples per prompt.", cite="POPri B.2; PrE-Text Figure 3",
                       lo=1)
    marker: str = param(MARKER, "Cut (and stop) generations at this string.",
                        cite="POPri Figure 5; PrE-Text Figure 3")

    def check(self) -> None:
        super().check()
        if not self.marker:  # "" would cut every generation to nothing
            raise ConfigError("must not be empty", field="marker")


@dataclass(frozen=True)
class VarySpec(FilterSpec, SamplingSpec):
    """``popri vary``: PE's Variation API, PrE-Text's mask-fill (section 3 (4), D.2) or Aug-PE's
    LLM paraphrase.  min_words / max_retries / max_new_tokens apply to paraphrase only."""

    method: str = param("mask-fill", "mask-fill (PrE-Text) or paraphrase (Aug-PE).",
                        choices=VARY_METHODS)
    model: str | None = param(None, f"mask-fill: masked LM (default {MLM_DEFAULT}, PrE-Text "
                              f"D.2). paraphrase: causal LM (default {DEFAULT_LM}).", short="-m")
    variations: int = param(1, "Variations per input written to --out (PE: 1).", short="-V",
                            lo=1)
    lookahead: int = param(0, "K variations per input averaged in embedding space (0 = off).",
                           cite="PrE-Text lookahead", short="-K", lo=0)
    embedder: str | None = param(None, "Sentence embedder for --lookahead (default "
                                 "all-MiniLM-L6-v2).", cite="PrE-Text D.2",
                                 envvar="POPRI_EMBED_MODEL")
    mask_ratio: float = param(0.3, "MASK%: share of tokens masked per step.",
                              cite="PrE-Text D.2: 30%", lo=0, hi=1, lo_open=True)
    steps: int = param(2, "W_steps mask-fill rounds.", cite="PrE-Text D.2", lo=1)
    fill: str = param("parallel", "parallel (one forward pass per step) or sequential "
                      "(PrE-Text's code: one per mask).", choices=FILL_MODES)
    chat: bool | None = param(None, "paraphrase: the model's chat template (default: when it "
                              "has one) or the plain prompt.")
    fallback: bool = param(True, "mask-fill without a loadable masked LM: paraphrase instead "
                           "(warned), or exit 3.")
    fallback_model: str = param(DEFAULT_LM, "Causal LM of the fallback.", nonempty=True)
    batch_size: int = same(SamplingSpec, "batch_size", 16)


@dataclass(frozen=True)
class ExpandSpec(GeneratorSpec):
    """``popri expand``: PrE-Text's Expand (Algorithm 1 line 11, section 3 (6), D.2); degenerate
    samples and duplicates are dropped, not regenerated."""

    shard_size: int = param(10000, "Rows per shard file.", lo=1)
    attempt_factor: float = param(3.0, "Give up after this many prompts per wanted sample (per "
                                  "shard).", lo=1, hi=1e6)
    batch_size: int | None = same(
        SamplingSpec, "batch_size", None,
        help=f"Prompts per engine call (default: transformers {EXPAND_BATCH['transformers']}, "
             f"vllm {EXPAND_BATCH['vllm']}, openai {EXPAND_BATCH['openai']}). Part of the "
             "config: it sets the chunks a shard is drawn in.")
    min_words: int = same(
        FilterSpec, "min_words", 4,
        help="Drop samples with fewer words (the project's PrE-Text post-filter; the paper states "
             "none).")

    @property
    def batch(self) -> int:
        """The prompts per engine call in effect: ``batch_size``, else the backend's
        (:data:`EXPAND_BATCH`)."""
        return self.batch_size or EXPAND_BATCH[self.backend]


def sampling_of(spec: SamplingSpec) -> dict:
    """The :class:`SamplingSpec` fields of any spec that has them (e.g. to pass vary's settings
    on to the generator)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(SamplingSpec)}


def settle(spec_cls, spec, overrides: dict):
    """``spec`` (default: ``spec_cls()``) with ``overrides`` (field=value keywords) applied and
    validated: library functions take a spec, or its fields as keywords."""
    spec = spec_cls() if spec is None else spec
    if not isinstance(spec, spec_cls):
        raise TypeError(f"expected a {spec_cls.__name__}, got {type(spec).__name__}")
    if overrides:
        names = {f.name for f in dataclasses.fields(spec_cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (not a "
                            f"{spec_cls.__name__} field)")
        spec = spec.replace(**overrides)
    return spec
