"""Private Evolution's ``Variation`` API: mask-fill (PrE-Text) and LLM paraphrase (Aug-PE).

    popri vary runs/pe/round1/survivors.jsonl --method mask-fill --seed 0 --round 2 --out pop2.jsonl
    popri vary pop.jsonl --lookahead 4 --lookahead-out runs/pe/round1/lookahead.npy --out -
    popri gen omega.jsonl -K 4 -J 2 | popri vary - --method paraphrase --variations 2

mask-fill ("PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs",
PrE-Text, arXiv:2406.02958, section 3 (4), appendix D.2): a text is cut to ``max_tokens`` tokens
of the masked LM's tokenizer; each step masks ``round(mask_ratio * L)`` (at least 1) of its L
tokens, chosen uniformly, and fills every masked position from softmax(logits / temperature) with
top-p; ``steps`` such steps (W_steps) give the variation.  Defaults RoBERTa-large, MASK% 30 %,
W_steps 2, top-p 1.0, temperature 1.0.  Token ids are carried from step to step (no decode in
between, as PrE-Text's code); special tokens are never drawn.  ``fill='parallel'`` fills all masks
of a step from one forward pass (positions sampled independently, as Aug-PE's MLM variation);
``'sequential'`` fills them one per forward pass in random order, each conditioned on those
already filled (PrE-Text's reference ``variation.py``; ~MASK% x L times the forward passes).

paraphrase (the rephrase variation of Aug-PE, "Differentially Private Synthetic Data via
Foundation Model APIs 2: Text", arXiv:2403.01749): a causal LLM rewrites the text from a rephrase
prompt, through :func:`popri.models.generation.generate` (its engine factory; batched, per-sample
seeds, cleaned, truncated to ``max_tokens``, degenerate ones regenerated up to ``max_retries``
times, then kept and flagged).

The settings are a :class:`~popri.specs.generation.VarySpec`; :func:`vary_file` is the whole
``popri vary`` step.  Every variation k of parent i is seeded from (seed, i, k) only, so the first
V of K variations are the same whether K or V were asked for (lookahead re-uses them).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import log, runtime
from popri.core.compat import dtype_kwargs
from popri.core.errors import InputError, MissingResourceError
from popri.core.guard import check_outputs
from popri.core.io import STDIO, AtomicOutputs, dumps, iter_jsonl, save_embedding_set, write_jsonl
from popri.data.tokenize import hf_counter, prefix_for_tokens
from popri.models import generation, llm
from popri.models.embed import embed_texts, model_meta
from popri.models.lora import require_adapter
from popri.specs.generation import (
    DEFAULT_LM,
    FILL_MODES,
    MLM_DEFAULT,
    GenSpec,
    VarySpec,
    sampling_of,
    settle,
)

PARAPHRASE_DEFAULT = DEFAULT_LM  # the offline causal LM (popri.models.llm)
# Aug-PE's HF rephrase prompt ("Please rephrase the following sentences ...:\n{text} \n") made
# explicit about meaning and style; the model writes after "Rephrased text:".
PARAPHRASE_TEMPLATE = ("Please rephrase the following text, keeping its meaning and style:\n"
                       "Text: {text}\nRephrased text:")
PARAPHRASE_CHAT = ("Rephrase the following text, keeping its meaning and style. Reply with the "
                   "rephrased text only.\n\n{text}")
PARAPHRASE_MARKER = "\n\n"  # a paraphrase is one paragraph: cut (and stop) at a blank line
# a chat reply's lead-in ("Here's the rephrased text:", "A revised version:"), dropped
_PREAMBLE = re.compile(r"^\s*(?:(?:sure|certainly|of course)\b[^:\n]{0,20}?[,.!]\s*)?"
                       r"(?:here(?:'s| is)\b[^:\n]{0,60}|[^:\n]{0,40}\b(?:rephras|paraphras|"
                       r"revis|rewrit|reword)\w*[^:\n]{0,40}):\s*", re.IGNORECASE)
_TAG = 0x5641  # separates mask-fill seed streams from generation's


def _one_line(e: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {msg[:limit]}"


# --------------------------------------------------------------------------- mask-fill
def _hub_host() -> tuple[str, int]:
    import os
    from urllib.parse import urlparse

    u = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return u.hostname or "huggingface.co", u.port or (80 if u.scheme == "http" else 443)


def hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the hub within ``timeout`` s (or a proxy is configured).  Without
    this probe an offline hub download spends ~1 minute in huggingface_hub's retries before the
    fallback can start."""
    import os
    import socket

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    try:
        socket.create_connection(_hub_host(), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_masked_lm(name: str, *, dtype: str = "float32", device: str | None = None):
    """(model, tokenizer) of a masked LM: a local checkpoint directory or a hub id (the local
    hub cache first, then the network unless ``HF_HUB_OFFLINE``).  MissingResourceError if it
    cannot be loaded or has no mask token."""
    import os

    torch = runtime.configure_torch()
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = Path(name).expanduser()
    path = str(p.resolve()) if p.exists() else name
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    if not p.exists() and name.startswith(("/", "./", "../", "~")):
        raise MissingResourceError(f"cannot load masked LM {name!r}: no such directory")
    offline = p.exists() or os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0")

    def attempt(local: bool):
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local)
        return AutoModelForMaskedLM.from_pretrained(path, **dtype_kwargs(torch_dtype),
                                                    local_files_only=local), tok

    try:  # a local directory, or the local hub cache
        model, tok = attempt(True)
    except Exception as e:  # not there / not an MLM checkpoint
        if offline:
            raise MissingResourceError(f"cannot load masked LM {name!r}: {_one_line(e)}") from None
        if not hub_reachable():
            raise MissingResourceError(
                f"cannot load masked LM {name!r}: not in the local Hugging Face cache and the hub "
                f"({_hub_host()[0]}) is unreachable") from None
        try:
            model, tok = attempt(False)
        except Exception as e2:
            raise MissingResourceError(f"cannot load masked LM {name!r}: {_one_line(e2)}") from None
    if tok.mask_token_id is None:
        raise MissingResourceError(f"{name!r} has no mask token: not a masked language model")
    if device:
        model = model.to(device)
    model.eval()
    return model, tok


def mask_count(n_tokens: int, mask_ratio: float) -> int:
    """MASK% of the tokens, rounded half up, at least one (none of an empty text)."""
    if n_tokens <= 0:
        return 0
    return min(n_tokens, max(1, math.floor(mask_ratio * n_tokens + 0.5)))


class MaskFiller:
    """Mask-and-fill steps with a masked LM, batched; one seed stream per (parent, variation)."""

    def __init__(self, model: str, *, device: str | None = None, bf16: bool = True,
                 model_obj=None, tokenizer_obj=None):
        self.torch = runtime.configure_torch()
        if model_obj is None:
            self.device = device or llm.default_device()
            dtype = "bfloat16" if bf16 and self.device.startswith("cuda") else "float32"
            model_obj, tokenizer_obj = load_masked_lm(model, dtype=dtype, device=self.device)
        else:
            self.device = str(getattr(model_obj, "device", device or "cpu"))
        self.model, self.tok = model_obj, tokenizer_obj
        self.autocast = bf16 and not self.device.startswith("cuda")
        tok = self.tok
        if tok.mask_token_id is None:
            raise MissingResourceError(f"{model!r} has no mask token: not a masked language model")
        first = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        last = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        self.prefix = [first] if first is not None else []
        self.suffix = [last] if last is not None else []
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        head_out = self.model.get_output_embeddings()
        vocab = int(head_out.weight.shape[0]) if head_out is not None else len(tok)
        self.banned = sorted({int(i) for i in tok.all_special_ids if i is not None and i < vocab})
        self.n_tok = len(tok)  # a padded output vocabulary's extra rows are never drawn
        limits = (getattr(tok, "model_max_length", None),
                  getattr(self.model.config, "max_position_embeddings", None), 10**6)
        self.max_len = int(min(x for x in limits if x)) - len(self.prefix) - len(self.suffix)
        # heads that act per position (RoBERTa's lm_head, BERT's cls): logits at the masked
        # positions only, not [batch, length, vocab]
        base = getattr(self.model, getattr(self.model, "base_model_prefix", ""), None)
        head = next((h for h in (getattr(self.model, n, None) for n in ("lm_head", "cls"))
                     if isinstance(h, self.torch.nn.Module)), None)
        self.split_head = (base, head) if base is not None and head is not None else None

    # ---- text <-> ids
    def encode(self, texts: Sequence[str], max_tokens: int) -> list[list[int]]:
        """Token ids without special tokens, cut to ``max_tokens`` (and the model's length)."""
        limit = max(1, min(int(max_tokens), self.max_len))
        count = hf_counter(self.tok)  # a long text is cut first (same ids: see prefix_for_tokens)
        texts = [prefix_for_tokens(generation.normalise_ws(t), limit, count) for t in texts]
        if not texts:
            return []
        ids = self.tok(texts, add_special_tokens=False)["input_ids"]
        return [list(x[:limit]) for x in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return generation.normalise_ws(self.tok.decode(list(ids), skip_special_tokens=True))

    # ---- model
    def logits_at(self, input_ids, attention_mask, rows, cols):
        """float32 logits [len(rows), vocab] at (rows, cols) of the batch."""
        torch = self.torch
        with torch.inference_mode(), llm.autocast(self.device, self.autocast):
            if self.split_head is not None:
                base, head = self.split_head
                hidden = base(input_ids=input_ids, attention_mask=attention_mask)[0]
                logits = head(hidden[rows, cols])
            else:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
                logits = logits[rows, cols]
        return logits.float()

    def _sample(self, logits, temperature: float, top_p: float, seeds: list[int]):
        logits[:, self.banned] = float("-inf")
        logits[:, self.n_tok:] = float("-inf")
        if temperature == 0:
            return logits.argmax(-1)
        sampler = generation.RowSampler(temperature, top_p, seeds, logits.device)
        return sampler(None, logits).argmax(-1)

    def fill_step(self, seqs: list[list[int]], keys: Sequence[tuple[int, int]], *, seed: int,
                  step: int, mask_ratio: float, temperature: float = VarySpec.temperature,
                  top_p: float = VarySpec.top_p, fill: str = VarySpec.fill,
                  batch_size: int = VarySpec.batch_size, tick=None):
        """One step for every sequence: mask ``mask_count(L)`` positions (chosen with the
        generator of (seed, key, step)), fill them.  Returns (new sequences, masked positions)."""
        if fill not in FILL_MODES:
            raise ValueError(f"fill must be one of {FILL_MODES}")
        torch = self.torch
        positions = []
        for s, key in zip(seqs, keys):
            rng = np.random.default_rng([int(seed), *map(int, key), int(step), _TAG])
            n = mask_count(len(s), mask_ratio)
            positions.append([int(p) for p in rng.permutation(len(s))[:n]])
        new = [list(s) for s in seqs]
        order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i]), i))  # similar lengths batch
        off = len(self.prefix)
        for b in range(0, len(order), batch_size):
            idx = [i for i in order[b:b + batch_size] if positions[i]]
            if not idx:
                if tick:
                    tick(len(order[b:b + batch_size]))
                continue
            width = max(len(seqs[i]) for i in idx) + off + len(self.suffix)
            ids = torch.full((len(idx), width), self.pad, dtype=torch.long)
            attn = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                row = self.prefix + seqs[i] + self.suffix
                ids[r, :len(row)] = torch.tensor(row)
                attn[r, :len(row)] = 1
                ids[r, [off + p for p in positions[i]]] = self.tok.mask_token_id
            if fill == "parallel":
                groups = [[(r, p) for r, i in enumerate(idx) for p in positions[i]]]
            else:  # PrE-Text's order: all masked, then one fill per forward pass
                most = max(len(positions[i]) for i in idx)
                groups = [[(r, positions[i][j]) for r, i in enumerate(idx) if len(positions[i]) > j]
                          for j in range(most)]
            ids, attn = ids.to(self.model.device), attn.to(self.model.device)
            for group in groups:
                rows = torch.tensor([r for r, _ in group], device=ids.device)
                cols = torch.tensor([off + p for _, p in group], device=ids.device)
                seeds = [generation.derive_seed(seed, *keys[idx[r]], step, p, _TAG)
                         for r, p in group]
                logits = self.logits_at(ids, attn, rows, cols).clone()  # a normal tensor
                ids[rows, cols] = self._sample(logits, temperature, top_p, seeds).to(ids.dtype)
            got = ids.cpu()
            for r, i in enumerate(idx):
                new[i] = got[r, off:off + len(seqs[i])].tolist()
            if tick:
                tick(len(order[b:b + batch_size]))
        return new, positions


def mask_fill(texts: Sequence[str], spec: VarySpec | None = None, *, n_per: int = 1,
              seed: int = 0, device: str | None = None, filler: MaskFiller | None = None,
              **settings) -> tuple[list[list[str]], dict]:
    """``n_per`` mask-fill variations of each text -> (texts[i][k], stats)."""
    spec = settle(VarySpec, spec, settings)
    t0 = time.perf_counter()
    filler = filler or MaskFiller(spec.model or MLM_DEFAULT, device=device, bf16=spec.bf16)
    load_s = time.perf_counter() - t0
    enc = filler.encode(texts, spec.max_tokens)
    steps = spec.steps
    jobs = [(i, k) for i in range(len(texts)) for k in range(n_per)]
    seqs = [enc[i] for i, _ in jobs]
    masked = changed = 0
    t1 = time.perf_counter()
    with log.progress() as prog:
        task = prog.add_task("mask-fill", total=len(jobs) * steps)
        for s in range(steps):
            before = seqs
            seqs, pos = filler.fill_step(seqs, jobs, seed=seed, step=s,
                                         mask_ratio=spec.mask_ratio, temperature=spec.temperature,
                                         top_p=spec.top_p, fill=spec.fill,
                                         batch_size=spec.batch_size,
                                         tick=lambda n: prog.advance(task, n))
            masked += sum(map(len, pos))
            changed += sum(a != b for x, y in zip(before, seqs) for a, b in zip(x, y))
    out: list[list[str]] = [[""] * n_per for _ in texts]
    for (i, k), s in zip(jobs, seqs):
        out[i][k] = filler.decode(s)
    secs = time.perf_counter() - t1
    stats = {"masked_tokens": masked, "changed_tokens": changed,
             "input_tokens": int(sum(len(e) for e in enc)), "load_seconds": round(load_s, 3),
             "seconds": round(secs, 3), "fill": spec.fill}
    return out, stats


# --------------------------------------------------------------------------- paraphrase
def check_paraphrase_template(template: str) -> None:
    try:
        fields = generation.template_fields(template)
    except ValueError as e:
        raise InputError(f"malformed template ({e}); write literal braces as {{{{ and }}}}",
                         field="template") from None
    bad = sorted(set(fields) - {"text"})
    if bad:
        raise InputError(f"unknown placeholder {{{bad[0]}}}: the only one is {{text}}",
                         field="template")
    if "text" not in fields:
        raise InputError("the template must contain {text}", field="template")


def strip_preamble(text: str) -> str:
    """Drop a lead-in such as "Here's the rephrased text:" when text follows it."""
    rest = _PREAMBLE.sub("", text, count=1)
    return rest if rest.strip() else text


def clean_paraphrase(raw: str, tokenizer, max_tokens: int, marker: str) -> str:
    """Lead-in dropped, cut at the first blank line (one paragraph), whitespace-normalised,
    truncated to ``max_tokens`` tokens (generation's cleaning)."""
    text = strip_preamble(raw.strip())
    text = text.split(PARAPHRASE_MARKER, 1)[0]
    return generation.clean_generation(text, tokenizer, max_tokens, marker)


def paraphrase_prompts(texts: Sequence[str], template: str | None = None, *,
                       chat_tokenizer=None) -> list[dict]:
    """One prompt per text (``generation.generate``'s prompt records).  With ``chat_tokenizer``
    the (user message) template goes through that tokenizer's chat template."""
    out = []
    for i, t in enumerate(texts):
        t = generation.normalise_ws(t)
        if chat_tokenizer is not None:
            msg = (template or PARAPHRASE_CHAT).format(text=t)
            prompt = chat_tokenizer.apply_chat_template([{"role": "user", "content": msg}],
                                                        tokenize=False, add_generation_prompt=True)
        else:
            prompt = (template or PARAPHRASE_TEMPLATE).format(text=t)
        out.append({"prompt_id": i, "prompt": prompt, "example_texts": [t]})
    return out


def paraphrase(texts: Sequence[str], spec: VarySpec | None = None, *,
               adapter: str | None = None, n_per: int = 1, seed: int = 0,
               template: str | None = None, device: str | None = None, model_obj=None,
               tokenizer_obj=None, **settings) -> tuple[list[list[str]], list[list[bool]], dict]:
    """``n_per`` LLM paraphrases of each text -> (texts[i][k], degenerate[i][k], stats), by
    ``spec.model`` (default smollm2-135m) + ``adapter``.

    ``spec.chat`` None: the chat template when the tokenizer has one (SmolLM2-135M-Instruct
    paraphrased better so), else the plain template.  A chat reply runs to the end of the turn
    (EOS); a plain one stops at a blank line.  Sample k of text i is drawn with the generator
    seeded from (seed, attempt, i, k) (generation's seeding); a paraphrase equal to its text, or
    whose first 8 words are in the prompt, is a copy and regenerated like other degenerate ones."""
    spec = settle(VarySpec, spec, settings)
    model = spec.model or PARAPHRASE_DEFAULT
    tok = tokenizer_obj or llm.load_tokenizer(model)
    has_chat = bool(getattr(tok, "chat_template", None))
    if spec.chat and not has_chat:
        raise InputError(f"{model!r} has no chat template; use the plain prompt (--no-chat)",
                         field="chat")
    use_chat = has_chat if spec.chat is None else bool(spec.chat)
    prompts = paraphrase_prompts(texts, template, chat_tokenizer=tok if use_chat else None)
    marker = (tok.eos_token or PARAPHRASE_MARKER) if use_chat else PARAPHRASE_MARKER
    gen_spec = GenSpec(**sampling_of(spec), model=model, min_words=spec.min_words,
                       max_retries=spec.max_retries, samples_per_prompt=n_per, marker=marker)
    recs, st = generation.generate(prompts, gen_spec, adapter=adapter, seed=seed, device=device,
                                   model_obj=model_obj, tokenizer_obj=tok, clean=clean_paraphrase)
    out = [[""] * n_per for _ in texts]
    bad = [[False] * n_per for _ in texts]
    for r in recs:
        out[r["prompt_id"]][r["sample_idx"]] = r["text"]
        bad[r["prompt_id"]][r["sample_idx"]] = bool(r.get("degenerate"))
    keep = ("generated", "regenerated", "degenerate_first_pass", "degenerate_first_pass_reasons",
            "kept_degenerate", "kept_degenerate_reasons", "generated_tokens", "seconds",
            "load_seconds", "tokens_per_s")
    return out, bad, {"prompt_format": "chat" if use_chat else "plain", **{k: st[k] for k in keep}}


# --------------------------------------------------------------------------- driver
def vary(texts: Sequence[str], spec: VarySpec | None = None, *, n_per: int | None = None,
         seed: int = 0, template: str | None = None, adapter: str | None = None,
         device: str | None = None, **settings) -> dict:
    """``n_per`` (default max(variations, lookahead)) variations of each text by
    ``spec.method``; a mask-fill whose MLM cannot be loaded falls back to paraphrase with
    ``spec.fallback_model`` (warned) unless ``spec.fallback`` is False.  ``spec``'s fields may
    also be given as keywords (``vary(texts, method="paraphrase", model="smollm2-135m")``).

    Returns ``{"texts": [[str]], "degenerate": [[bool]], "method", "model", "adapter", "stats"}``
    where method/model/adapter are the ones that actually ran."""
    spec = settle(VarySpec, spec, settings)
    n_per = max(spec.variations, spec.lookahead) if n_per is None else n_per
    if n_per < 1:
        raise ValueError("n_per must be >= 1")
    method = spec.method
    model = spec.model or (MLM_DEFAULT if method == "mask-fill" else PARAPHRASE_DEFAULT)
    stats: dict = {"method_requested": method, "fallback": None}
    if method == "mask-fill":
        t0 = time.perf_counter()
        try:
            filler = MaskFiller(model, device=device, bf16=spec.bf16)
        except MissingResourceError as e:
            if not spec.fallback:
                raise MissingResourceError(f"{e} (and --no-fallback forbids the paraphrase "
                                           "fallback)") from None
            log.warn(f"vary: {e}; falling back to --method paraphrase with "
                     f"{spec.fallback_model!r}")
            stats["fallback"] = {"from_method": "mask-fill", "from_model": model,
                                 "reason": str(e), "to_model": spec.fallback_model}
            model = spec.fallback_model
        else:
            load_s = time.perf_counter() - t0
            out, st = mask_fill(texts, spec.replace(model=model), n_per=n_per, seed=seed,
                                filler=filler)
            stats.update(st, load_seconds=round(load_s, 3))
            return {"texts": out, "degenerate": [[False] * n_per for _ in texts],
                    "method": "mask-fill", "model": model, "adapter": None, "stats": stats}
    if stats["fallback"]:
        adapter = None  # an adapter belongs to a paraphrase --model, not to the fallback
    out, bad, st = paraphrase(texts, spec.replace(model=model), adapter=adapter, n_per=n_per,
                              seed=seed, template=template, device=device)
    stats.update(st)
    return {"texts": out, "degenerate": bad, "method": "paraphrase", "model": model,
            "adapter": adapter, "stats": stats}


def lookahead_means(texts: Sequence[Sequence[str]], k: int, *, embedder: str | None = None,
                    batch_size: int = 64) -> np.ndarray:
    """PrE-Text's lookahead: the mean of the embeddings of the first ``k`` variations of each
    parent, float32 [n, d] (of L2-normalised embeddings; the mean itself is not normalised)."""
    flat = [t for row in texts for t in row[:k]]
    if any(len(row) < k for row in texts):
        raise ValueError(f"every parent needs {k} variations")
    emb = embed_texts(flat, embedder, normalize=True, batch_size=batch_size,
                      desc="embed lookahead")
    return emb.reshape(len(texts), k, -1).mean(axis=1, dtype=np.float64).astype(np.float32)


def variation_rows(ids: Sequence, result: dict, variations: int, round_no: int) -> list[dict]:
    """Output rows, parent by parent: ``{"id": "<parent>-v<k>", "parent_id", "round",
    "variation_idx", "text", "method", "model"}`` (+ adapter, + ``"degenerate": true``)."""
    rows = []
    for pid, texts, bad in zip(ids, result["texts"], result["degenerate"]):
        for k in range(variations):
            r = {"id": f"{pid}-v{k}", "parent_id": pid, "round": int(round_no), "variation_idx": k,
                 "text": texts[k], "method": result["method"], "model": result["model"]}
            if result.get("adapter"):
                r["adapter"] = str(result["adapter"])
            if bad[k]:
                r["degenerate"] = True
            rows.append(r)
    return rows


# --------------------------------------------------------------------------- the step
def read_inputs(path: str) -> tuple[list, list[str]]:
    """(ids, texts) of the input JSONL ('-': stdin); an id defaults to the row's position; ids
    must be unique (a variation's id is '<id>-v<k>'); errors name file, line and field."""
    ids, texts, first = [], [], {}
    for pos, r in enumerate(iter_jsonl(path, required=("text",), locate=True)):
        line = r["_line"]
        rid = r.get("id", str(pos))
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise InputError("must be a string or an integer", path=path, line=line, field="id")
        if str(rid) in first:
            raise InputError(f"duplicate id {rid!r} (first on line {first[str(rid)]}); variation "
                             "ids are '<id>-v<k>' and must be unique", path=path, line=line,
                             field="id")
        first[str(rid)] = line
        ids.append(rid)
        texts.append(r["text"])
    if not texts:
        raise InputError("no samples to vary", path=path)
    return ids, texts


def vary_file(input: str, spec: VarySpec, *, out: str = "-", lookahead_out: str | None = None,
              stats_out: str | None = None, template: str | None = None,
              adapter: str | None = None, seed: int = 0, round_no: int = 0,
              device: str | None = None) -> dict:
    """The ``popri vary`` step: ``spec.variations`` rows per text of ``input`` (JSONL or '-') at
    ``out`` ('-': stdout); with ``spec.lookahead`` K also the mean embedding of K variations per
    input as the embedding set ``lookahead_out`` (PrE-Text's lookahead); counts, fallback and
    timings at ``stats_out``.  ``template``: a paraphrase prompt FILE with {text}.  Every input
    and output is checked before a model loads; outputs are written atomically.  Returns the
    stats."""
    t_start = time.perf_counter()
    if spec.lookahead and not lookahead_out:
        raise InputError("--lookahead K needs --lookahead-out SET.npy", field="lookahead-out")
    if lookahead_out and not spec.lookahead:
        raise InputError("--lookahead-out needs --lookahead K >= 1", field="lookahead")
    if lookahead_out and not lookahead_out.endswith(".npy"):
        raise InputError("must end in .npy (an embedding set)", path=lookahead_out,
                         field="lookahead-out")
    if stats_out == STDIO or lookahead_out == STDIO:
        raise InputError("stdout carries the variations; give a file name",
                         field="stats-out" if stats_out == STDIO else "lookahead-out")
    if adapter:
        require_adapter(adapter)
    check_outputs([out, stats_out, lookahead_out],
                  [input, template, adapter,
                   *(m for m in (spec.model, spec.embedder, spec.fallback_model)
                     if m and Path(m).exists())],
                  companions="embeddings")
    tmpl = generation.read_template(template, check_paraphrase_template)

    ids, texts = read_inputs(input)
    n_per = max(spec.variations, spec.lookahead)
    res = vary(texts, spec, n_per=n_per, seed=seed, template=tmpl, adapter=adapter,
               device=device)
    rows = variation_rows(ids, res, spec.variations, round_no)
    stats = {"input": input, "inputs": len(texts), "variations": spec.variations,
             "lookahead": spec.lookahead, "generated_per_input": n_per, "rows": len(rows),
             "method": res["method"], "model": res["model"], **res["stats"],
             "params": {"seed": seed, "round": round_no, "mask_ratio": spec.mask_ratio,
                        "steps": spec.steps, "fill": spec.fill, "temperature": spec.temperature,
                        "top_p": spec.top_p, "max_tokens": spec.max_tokens,
                        "max_new_tokens": spec.max_new_tokens, "min_words": spec.min_words,
                        "max_retries": spec.max_retries, "template": template or "builtin",
                        "chat": spec.chat, "batch_size": spec.batch_size, "bf16": spec.bf16}}
    la = None
    if spec.lookahead:
        t0 = time.perf_counter()
        emb = lookahead_means(res["texts"], spec.lookahead, embedder=spec.embedder)
        la = (emb, [{"id": i, "text": t} for i, t in zip(ids, texts)],
              {**model_meta(spec.embedder, True), "lookahead": spec.lookahead,
               "method": res["method"], "variation_model": res["model"], "seed": seed,
               "round": round_no,
               "mean_of": "L2-normalised embeddings of variations 0..K-1 (not re-normalised)"})
        stats["embed_seconds"] = round(time.perf_counter() - t0, 3)
    stats["total_seconds"] = round(time.perf_counter() - t_start, 3)
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in rows)
        if la is not None:
            save_embedding_set(lookahead_out, *la, out=staged)
        if stats_out:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(rows, STDIO)
    return stats
