"""Downstream utility: fine-tune a small causal LM on (synthetic) text, measure next-token accuracy.

    popri train-downstream syn.jsonl --val data/sotu --out runs/ds
    popri eval accuracy --model runs/ds --data data/sotu --split test --per-client-out m.jsonl
    popri eval gap --method m.jsonl --eps0 e0.jsonl --epsinf ei.jsonl

Sequences (training, validation and test alike; the recipe of the reference code of "Private
Federated Learning using Preference-Optimized Synthetic Data" (POPri, arXiv:2504.16438; its
``downstream_eval.py``) and of "PrE-Text: Training Language Models on Private Federated Data in
the Age of LLMs" (PrE-Text, arXiv:2406.02958; its ``eval_distilgpt2.py``)):
``[START] + tokens(text) + [EOS]``, cut to ``max_length`` (64, POPri B.1) from the right, so a text that fills the window loses its EOS.  ``tokens(text)`` is the tokenizer
called with ``add_special_tokens=False``, so it never adds a BOS itself; START is the
tokenizer's BOS, or its EOS when it has no BOS (GPT-2 style, where BOS = EOS).  A chat-turn
marker declared as BOS/EOS (SmolLM2-Instruct's ``<|im_start|>`` / ``<|im_end|>``) is replaced by
the document separator ``<|endoftext|>`` the model saw around plain text in pretraining.

Counted positions: position j (1 <= j < n) of a sequence of n real tokens is predicted from
tokens 0..j-1 (shifted labels).  Hence every sequence has n - 1 targets: START is never a
target, padding never counts, and the appended EOS counts (as in both reference codes) unless
``count_eos=False``.  Accuracy = argmax hits / targets and loss = summed cross-entropy /
targets, both micro-averaged over all targets; per client the same sums are kept, so a client
macro average and a bootstrap over test clients (the unit of privacy) come for free.  Records
without ``client_id`` are each their own client.

The settings are :class:`~popri.specs.training.EvalSpec` (``eval accuracy``) and
:class:`~popri.specs.training.DownstreamSpec` (``train-downstream``; POPri B.1, PrE-Text D.2).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import log, outdir, runtime
from popri.core.errors import InputError
from popri.core.io import writing
from popri.data.records import text_records
from popri.data.tokenize import hf_counter, prefix_for_tokens
from popri.eval.stats import (  # noqa: F401 (the statistics, re-exported)
    PER_CLIENT_FIELDS,
    replicate_weights,
    bootstrap_se,
    control_diff,
    gap_closed,
    gap_from_files,
    macro_accuracy,
    micro_accuracy,
    paired_bootstrap,
    per_client_table,
    read_per_client,
)
from popri.models import llm
from popri.models.lora import ADAPTER_CONFIG, lora_config
from popri.specs.training import DownstreamSpec, EvalSpec


# --------------------------------------------------------------------------- records
def load_records(src, split: str, *, max_samples: int | None = None,
                 sample_seed: int | None = None) -> tuple[list[dict], str]:
    """``src``: a list of dicts with ``text``, a federated dataset directory (its ``split``) or a
    JSONL path.  Returns (records, source name): all of them, the first ``max_samples``, or with
    ``sample_seed`` a seeded random sample of ``max_samples`` in their file order (the same
    records for every model evaluated with that seed: the arms stay paired)."""
    if isinstance(src, (str, os.PathLike)):
        recs, source = text_records(str(src), split)
    else:
        recs, source = list(src), "<records>"
        for i, r in enumerate(recs, start=1):
            if isinstance(r, dict) and "text" in r and not isinstance(r["text"], str):
                raise InputError(f"must be a string (got {type(r['text']).__name__})",
                                 path=source, line=i, field="text")
            if not isinstance(r, dict) or not isinstance(r.get("text"), str):
                raise InputError("missing required field", path=source, line=i, field="text")
    if max_samples is not None and sample_seed is not None and max_samples < len(recs):
        keep = np.sort(np.random.default_rng(sample_seed).choice(len(recs), max_samples,
                                                                 replace=False))
        recs = [recs[i] for i in keep]
    elif max_samples is not None:
        recs = recs[:max_samples]
    return recs, source


def client_of(rec: dict, index: int) -> str:
    cid = rec.get("client_id")
    if cid is None:
        cid = rec.get("id", index)
    return str(cid)


# --------------------------------------------------------------------------- tokenisation
def _token_id(tok, token: str, what: str) -> int:
    tid = tok.convert_tokens_to_ids(token)
    if tid is None or (tok.unk_token_id is not None and tid == tok.unk_token_id
                       and token != tok.unk_token):
        raise InputError(f"{token!r} is not a token of {getattr(tok, 'name_or_path', 'the tokenizer')}",
                         field=what)
    return int(tid)


# Chat-turn markers that some instruct tokenizers declare as BOS/EOS (SmolLM2-Instruct: BOS
# <|im_start|>, EOS <|im_end|>).  Plain text in pretraining was delimited by the document separator
# <|endoftext|> instead: on SmolLM2-135M-Instruct the eps=0 baseline scores 0.2825 next-token
# accuracy with the chat markers and 0.2913 with <|endoftext|> (400 sotu test records), so the
# markers would flatter every gap-closed figure.
CHAT_TURN_MARKERS = ("<|im_start|>", "<|im_end|>")
DOC_SEPARATOR = "<|endoftext|>"


def default_text_tokens(tok) -> tuple[str | None, str | None]:
    """(BOS, EOS) to frame plain text when the user names none: the tokenizer's own, except that
    a chat-turn marker is replaced by the document separator ``<|endoftext|>`` when the vocabulary
    has one (None = the tokenizer's default)."""
    vocab_has_sep = DOC_SEPARATOR in tok.get_vocab()
    bos = eos = None
    if vocab_has_sep and tok.bos_token in CHAT_TURN_MARKERS:
        bos = DOC_SEPARATOR
    if vocab_has_sep and tok.eos_token in CHAT_TURN_MARKERS:
        eos = DOC_SEPARATOR
    return bos, eos


def special_ids(tok, bos_token: str | None = None, eos_token: str | None = None) -> tuple[int, int | None]:
    """(START id, EOS id): the given tokens, else the tokenizer's BOS (its EOS when it has no BOS)
    and EOS -- a chat-turn marker replaced by ``<|endoftext|>`` (``default_text_tokens``)."""
    auto_bos, auto_eos = default_text_tokens(tok)
    bos_token = bos_token if bos_token is not None else auto_bos
    eos_token = eos_token if eos_token is not None else auto_eos
    if bos_token is not None:
        start = _token_id(tok, bos_token, "bos_token")
    else:
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if start is None:
        raise InputError(f"tokenizer {getattr(tok, 'name_or_path', '')!r} has neither a BOS nor an "
                         "EOS token; give --bos-token")
    eos = _token_id(tok, eos_token, "eos_token") if eos_token is not None else tok.eos_token_id
    return int(start), (None if eos is None else int(eos))


def encode(tok, texts: Sequence[str], max_length: int = EvalSpec.max_length, *,
           bos_token: str | None = None,
           eos_token: str | None = None) -> list[tuple[list[int], bool]]:
    """Each text -> (ids, has_eos): ``[START] + tokens + [EOS]`` cut to ``max_length``."""
    if max_length < 2:
        raise ValueError("max_length must be at least 2 (START + one target)")

    start, eos = special_ids(tok, bos_token, eos_token)
    count = hf_counter(tok)  # a long text is cut first (same ids: see prefix_for_tokens)
    texts = [prefix_for_tokens(t, max_length, count) for t in texts]
    body = tok(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    out = []
    for ids in body:
        seq = [start] + list(ids)
        if eos is not None and len(seq) < max_length:
            out.append((seq + [eos], True))
        else:
            out.append((seq[:max_length], False))
    return out


def make_batch(seqs: Sequence[tuple[list[int], bool]], pad_id: int, count_eos: bool = True):
    """Right-padded tensors: input_ids, attention_mask and labels aligned with input_ids
    (-100 = not a target: position 0, padding, and the appended EOS when not counted)."""
    import torch

    width = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, has_eos) in enumerate(seqs):
        n = len(s)
        ids[i, :n] = torch.tensor(s)
        mask[i, :n] = 1
        labels[i, 1:n] = ids[i, 1:n]
        if has_eos and not count_eos:
            labels[i, n - 1] = -100
    return ids, mask, labels


def count_targets(seqs: Sequence[tuple[list[int], bool]], count_eos: bool = True) -> int:
    return sum(len(s) - 1 - (1 if (e and not count_eos) else 0) for s, e in seqs)


def padding_id(tok) -> int:
    """The token id a batch is padded with: the tokenizer's pad, else its EOS, else 0."""
    for t in (tok.pad_token_id, tok.eos_token_id, 0):
        if t is not None:
            return int(t)
    return 0


def token_stats(model, ids, mask, labels, *, bf16: bool, device: str):
    """Per-sequence (targets, correct, summed cross-entropy) and the summed loss tensor
    (differentiable when grad is enabled)."""
    import torch
    import torch.nn.functional as F

    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    with llm.autocast(device, bf16):
        logits = model(input_ids=ids, attention_mask=mask).logits
    tgt = labels[:, 1:]
    valid = tgt != -100
    sel = logits[:, :-1][valid].float()  # [targets, V]
    t = tgt[valid]
    ce = F.cross_entropy(sel, t, reduction="none")
    rows = valid.nonzero()[:, 0]
    nseq = ids.shape[0]
    with torch.no_grad():
        hit = (sel.argmax(-1) == t).to(torch.float64)
        n_tok = torch.zeros(nseq, dtype=torch.float64, device=ids.device).index_add_(
            0, rows, torch.ones_like(hit))
        n_hit = torch.zeros(nseq, dtype=torch.float64, device=ids.device).index_add_(0, rows, hit)
        n_ce = torch.zeros(nseq, dtype=torch.float64, device=ids.device).index_add_(
            0, rows, ce.detach().to(torch.float64))
    return n_tok.cpu().numpy(), n_hit.cpu().numpy(), n_ce.cpu().numpy(), ce.sum()


# --------------------------------------------------------------------------- model loading
def adapter_base(path: Path) -> str:
    """The base model a PEFT adapter directory was trained on (its metrics.json, else its
    adapter config)."""
    meta = path / "metrics.json"
    if meta.exists():
        try:
            base = json.loads(meta.read_text(encoding="utf-8")).get("base_model")
            if base:
                return str(base)
        except json.JSONDecodeError:
            pass

    cfg = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return cfg["base_model_name_or_path"]


def load_model(name: str, adapter: str | None = None, *, device: str | None = None,
               trainable_adapter: bool = False):
    """(model, tokenizer); a directory holding a PEFT adapter (e.g. a LoRA train-downstream
    checkpoint) loads its base model (recorded in its metrics.json) with the adapter on top."""
    p = Path(name).expanduser()

    if adapter is None and p.is_dir() and (p / ADAPTER_CONFIG).exists():
        adapter, name = str(p), adapter_base(p)
    model, tok = llm.load_causal_lm(name, adapter, device=device, trainable_adapter=trainable_adapter)
    if adapter and (Path(adapter) / "tokenizer_config.json").exists():
        tok = llm.load_tokenizer(adapter)  # a train-downstream adapter records its BOS/EOS choice
    return model, tok


# --------------------------------------------------------------------------- evaluation
def evaluate_next_token(model_or_path, records, spec: EvalSpec | None = None, *,
                        adapter: str | None = None, tokenizer=None, split: str = "test",
                        seed: int = 0, device: str | None = None, desc: str = "eval",
                        **overrides) -> dict:
    """Next-token accuracy and loss of a causal LM on records (see the module docstring for the
    counted positions).  ``spec``: the settings (default ``EvalSpec()``; ``overrides``: field
    values on top, e.g. ``bootstrap=0``).  Returns micro accuracy/loss, token and client counts,
    the client macro accuracy, a bootstrap SE over clients (seeded by ``seed``) and
    ``per_client`` rows."""
    import torch

    spec = EvalSpec(**overrides) if spec is None else spec.replace(**overrides)
    max_length, count_eos, bf16 = spec.max_length, spec.count_eos, spec.bf16
    bos_token, eos_token, bootstrap = spec.bos_token, spec.eos_token, spec.bootstrap
    runtime.configure_torch()
    device = device or llm.default_device()
    recs, source = load_records(records, split, max_samples=spec.max_samples,  # fails fast
                                sample_seed=spec.sample_seed)
    if not recs:
        raise InputError("no records to evaluate", path=source)
    name = model_or_path if isinstance(model_or_path, (str, os.PathLike)) else None
    if name is not None:
        model, tok = load_model(str(name), adapter, device=device)
    else:
        model, tok = model_or_path, tokenizer
        if tok is None:
            raise ValueError("a model object needs its tokenizer= as well")
    seqs = encode(tok, [r["text"] for r in recs], max_length, bos_token=bos_token, eos_token=eos_token)
    start_id, eos_id = special_ids(tok, bos_token, eos_token)
    if count_targets(seqs, count_eos) == 0:
        raise InputError("no target tokens to evaluate (all texts empty?)", path=source, field="text")
    clients = [client_of(r, i) for i, r in enumerate(recs)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))  # less padding
    tok_n = np.zeros(len(seqs))
    hit_n = np.zeros(len(seqs))
    ce_n = np.zeros(len(seqs))
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad(), log.progress() as prog:
        task = prog.add_task(desc, total=len(seqs))
        for s in range(0, len(order), spec.batch_size):
            idx = order[s:s + spec.batch_size]
            batch = make_batch([seqs[i] for i in idx], padding_id(tok), count_eos)
            a, b, c, _ = token_stats(model, *batch, bf16=bf16, device=device)
            tok_n[idx], hit_n[idx], ce_n[idx] = a, b, c
            prog.advance(task, len(idx))
    seconds = time.perf_counter() - t0
    if was_training:
        model.train()
    per = per_client_table(clients, tok_n, hit_n, ce_n)
    tokens = int(tok_n.sum())
    res = {
        "accuracy": float(hit_n.sum() / tokens),
        "loss": float(ce_n.sum() / tokens),
        "tokens": tokens,
        "correct": int(hit_n.sum()),
        "sequences": len(seqs),
        "clients": len(per),
        "macro_accuracy": macro_accuracy(per),
        "accuracy_se": bootstrap_se(per, bootstrap, seed) if bootstrap else None,
        "bootstrap": int(bootstrap),
        "seed": int(seed),
        "sample_seed": spec.sample_seed,
        "model": str(name) if name is not None else getattr(model, "name_or_path", None),
        "adapter": adapter,
        "source": source,
        "split": split if isinstance(records, (str, os.PathLike)) and Path(records).is_dir() else None,
        "max_length": int(max_length),
        "count_eos": bool(count_eos),
        "bos_token": tok.convert_ids_to_tokens(start_id),
        "eos_token": None if eos_id is None else tok.convert_ids_to_tokens(eos_id),
        "bf16": bool(bf16),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "per_client": per,
    }
    return res


# --------------------------------------------------------------------------- training
def _check_val_not_test(src) -> None:
    if isinstance(src, (str, os.PathLike)):
        p = Path(src)
        if p.is_file() and p.name == "test.jsonl" and (p.parent / "manifest.json").exists():
            raise InputError("model selection must not look at the test split; give the dataset "
                             "directory (its val split is used) or another file", path=str(src))


def _legacy_model(p: Path) -> bool:
    """A model directory written before the ownership marker: train-downstream's own
    metrics.json (its ``best_epoch`` and ``history``) beside a model or an adapter."""
    try:
        m = json.loads((p / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(m, dict) and "best_epoch" in m and isinstance(m.get("history"), list)
            and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file()))


def _prepare_out(out_dir: str, force: bool, inputs=()) -> Path:
    """The directory-output rule (:func:`popri.core.outdir.check`): a non-empty ``out_dir`` is
    replaced only with ``force`` and only when it is a model popri wrote; never a file, a
    device, a link, a foreign directory, an input or a directory holding a ledger."""
    out = outdir.check(out_dir, inputs=inputs, legacy=_legacy_model)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError("output exists and is not empty (use --force to replace it)",
                         path=str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _better(m: dict, best: dict | None, select_by: str) -> bool:
    if best is None:
        return True
    if select_by == "loss":
        return m["val_loss"] < best["val_loss"]
    return (m["val_accuracy"], -m["val_loss"]) > (best["val_accuracy"], -best["val_loss"])


def _epoch(m, opt, seqs: list, perm, spec: DownstreamSpec, *, pad: int, device: str, step: int,
           title: str) -> tuple[float, int, int]:
    """One epoch of AdamW steps over ``seqs`` in the order ``perm`` (batches of
    ``spec.batch_size``, gradients accumulated over micro-batches, the loss the mean over the
    batch's target tokens), stopping at ``spec.max_steps`` (``step``: those taken before):
    (summed token loss, target tokens, steps)."""
    m.train()
    ep_loss, ep_tok, ep_steps = 0.0, 0, 0
    with log.progress() as prog:
        task = prog.add_task(title, total=math.ceil(len(seqs) / spec.batch_size))
        for s in range(0, len(perm), spec.batch_size):
            if spec.max_steps is not None and step + ep_steps >= spec.max_steps:
                break
            chunk = [seqs[i] for i in perm[s:s + spec.batch_size]]
            n_tgt = count_targets(chunk, spec.count_eos)
            opt.zero_grad(set_to_none=True)
            for u in range(0, len(chunk), spec.micro_batch_size):
                micro = chunk[u:u + spec.micro_batch_size]
                if count_targets(micro, spec.count_eos) == 0:
                    continue
                _, _, ce, loss_sum = token_stats(m, *make_batch(micro, pad, spec.count_eos),
                                                 bf16=spec.bf16, device=device)
                (loss_sum / max(n_tgt, 1)).backward()
                ep_loss += float(ce.sum())
            if n_tgt:
                opt.step()
            ep_tok += n_tgt
            ep_steps += 1
            prog.advance(task)
    return ep_loss, ep_tok, ep_steps


def stream_fingerprint(named_tensors) -> str:
    """sha256 (16 hex digits) of named tensors' names, dtypes, shapes and bytes: the downstream
    model's initial trainable weights in ``metrics.json``'s ``streams`` (issue 65's common
    random numbers: two arms with the same seed start from the same weights)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in named_tensors:
        a = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{a.dtype}|{tuple(a.shape)}|".encode())
        h.update(a.view(-1).view(torch.uint8).numpy().tobytes()
                 if a.numel() else b"")
    return h.hexdigest()[:16]


def order_fingerprint(perms) -> str:
    """sha256 (16 hex digits) of the epochs' sample orders (the batches, in order): the data
    order stream of ``metrics.json``'s ``streams``."""
    import hashlib

    h = hashlib.sha256()
    for p in perms:
        h.update(np.asarray(p, dtype=np.int64).tobytes() + b"|")
    return h.hexdigest()[:16]


def _taken(perm, spec: DownstreamSpec, step: int):
    """The part of an epoch's sample order its batches take (``max_steps`` may stop it)."""
    return perm if spec.max_steps is None else perm[:max(spec.max_steps - step, 0)
                                                    * spec.batch_size]


def streams(seed: int, init_sha: str, perms, precision: str) -> dict:
    """``metrics.json``'s ``streams`` (issue 65): the random streams a model was trained with,
    as fingerprints.  Two arms that share them (same seed, same N) started from the same
    weights and saw their samples in the same batches: only their text differed."""
    return {"seed": int(seed), "init_sha256": init_sha,
            "order_sha256": order_fingerprint(perms), "precision": precision}


def _save(m, tok, metrics: dict, out) -> None:
    """The model (or adapter), its tokenizer and ``metrics.json`` into ``out``, atomically."""
    tmp = outdir.staging_dir(out)
    try:
        # a full disk: safetensors raises its own error, not an OSError -- one line naming out
        with writing(out):
            m.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=False)
                                              + "\n", encoding="utf-8")
        outdir.replace(tmp, out, kind="downstream-model", legacy=_legacy_model)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def train_downstream(train_records, spec: DownstreamSpec | None = None, *, model: str,
                     out_dir: str, val_records=None, seed: int = 0, train_split: str = "train",
                     force: bool = False, device: str | None = None, **overrides) -> dict:
    """Fine-tune ``model`` on the ``text`` of ``train_records`` (a dataset directory: its
    ``train_split``) with AdamW; after every epoch evaluate on ``val_records`` with
    :func:`evaluate_next_token`; keep the best epoch (by validation ``select_by``: accuracy, ties
    -> lower loss -> earlier; or loss) and save it atomically to ``out_dir`` (full checkpoint,
    or the PEFT adapter with ``lora``) with ``metrics.json``.  Without ``val_records`` the last
    epoch is kept.  ``spec``: the settings (default ``DownstreamSpec()``; ``overrides``: field
    values on top); ``seed``: shuffling and LoRA initialisation."""
    spec = DownstreamSpec(**overrides) if spec is None else spec.replace(**overrides)
    lr, epochs, batch_size, bf16 = spec.lr, spec.epochs, spec.batch_size, spec.bf16
    max_length, count_eos, lora = spec.max_length, spec.count_eos, spec.lora
    torch = runtime.configure_torch()
    device = device or llm.default_device()
    out = _prepare_out(out_dir, force, inputs=[x for x in (train_records, val_records, model)
                                               if isinstance(x, (str, os.PathLike))
                                               and os.path.exists(x)])
    _check_val_not_test(val_records)
    recs, train_src = load_records(train_records, train_split, max_samples=spec.max_samples)
    if not recs:
        raise InputError("no training records", path=train_src)
    val, val_src = (load_records(val_records, "val", max_samples=spec.max_val_samples)
                    if val_records is not None else ([], None))
    if val_records is not None and not val:
        raise InputError("no validation records", path=val_src)

    torch.manual_seed(seed)
    m, tok = load_model(model, device=device)
    if getattr(m, "peft_config", None):  # continue from an adapter: fold it in first
        if lora:
            raise InputError("--lora on top of an adapter checkpoint is not supported; give its "
                             "base model, or train fully (--full)", path=str(model))
        m = m.merge_and_unload()
    base_model = str(model) if str(model) in llm.ALIASES else llm.resolve(str(model))
    if lora:
        from peft import get_peft_model

        m = get_peft_model(m, lora_config(m, spec))
    params = [p for p in m.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    init_sha = stream_fingerprint((n, p) for n, p in m.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=spec.weight_decay)
    # the checkpoint's tokenizer declares the START / EOS tokens it was trained with, so that
    # evaluating it with the defaults uses the same sequences
    start_id, eos_id = special_ids(tok, spec.bos_token, spec.eos_token)
    pad = padding_id(tok)  # before any EOS change: padding is masked anyway
    tok.bos_token = tok.convert_ids_to_tokens(start_id)
    if eos_id is not None:
        tok.eos_token = tok.convert_ids_to_tokens(eos_id)
    seqs = encode(tok, [r["text"] for r in recs], max_length)
    rng = np.random.default_rng(seed)
    steps_per_epoch = math.ceil(len(seqs) / batch_size)
    # the precision the steps compute in (llm.autocast's rule), not the flag asked for
    precision = "bf16 autocast" if llm.use_bf16(bf16, device) else "fp32"
    log.info(f"train-downstream: {len(seqs)} samples from {train_src}, {steps_per_epoch} steps/epoch "
             f"x {epochs} epochs, {'LoRA r=%d' % spec.lora_r if lora else 'full'} ({n_trainable:,} "
             f"trainable), lr {lr:g}, batch {batch_size}, {llm.compute_words(bf16, device)}")

    val_spec = EvalSpec(max_length=max_length, count_eos=count_eos, bf16=bf16,
                        batch_size=spec.eval_batch_size, bootstrap=0)

    def val_metrics(desc):
        r = evaluate_next_token(m, val, spec=val_spec, tokenizer=tok, device=device, desc=desc)
        return {"val_loss": r["loss"], "val_accuracy": r["accuracy"], "val_tokens": r["tokens"]}

    initial = val_metrics("val (initial)") if val else None
    if initial:
        log.info(f"train-downstream: initial val accuracy {initial['val_accuracy']:.4f} "
                 f"loss {initial['val_loss']:.4f}")
    history, best, best_state, step, perms = [], None, None, 0, []
    for epoch in range(1, epochs + 1):
        if spec.max_steps is not None and step >= spec.max_steps:
            break
        t0 = time.perf_counter()
        perm = rng.permutation(len(seqs))
        perms.append(_taken(perm, spec, step))
        ep_loss, ep_tok, ep_steps = _epoch(m, opt, seqs, perm, spec,
                                           pad=pad, device=device, step=step,
                                           title=f"epoch {epoch}")
        step += ep_steps
        seconds = time.perf_counter() - t0  # logged, not stored: metrics.json stays reproducible
        row = {"epoch": epoch, "steps": ep_steps, "train_loss": ep_loss / ep_tok if ep_tok else None,
               "train_tokens": ep_tok}
        if val:
            row.update(val_metrics(f"val (epoch {epoch})"))
        history.append(row)
        msg = f"train-downstream: epoch {epoch} train loss {row['train_loss'] or float('nan'):.4f}"
        if val:
            msg += f", val accuracy {row['val_accuracy']:.4f} loss {row['val_loss']:.4f}"
        log.info(msg + f" ({seconds:.1f}s, {seconds / max(ep_steps, 1):.2f}s/step)")
        if not val or _better(row, best, spec.select_by):
            best = row
            best_state = {n: p.detach().to("cpu", copy=True) for n, p in m.named_parameters()
                          if p.requires_grad}
    if best is None:
        raise InputError("no training step ran (max_steps=0?)", path=train_src)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in best_state:
                p.copy_(best_state[n].to(p.device))
    metrics = {
        "model": str(model), "base_model": base_model, **spec.to_dict(),
        "trainable_parameters": int(n_trainable), "train_source": train_src,
        "val_source": val_src, "n_train": len(seqs), "n_val": len(val), "steps": step,
        "seed": seed, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "select_by": spec.select_by if val else "last", "best_epoch": best["epoch"],
        "initial": initial, "history": history,
        "streams": streams(seed, init_sha, perms, precision),
    }
    if not lora:  # no adapter: its settings did not apply
        metrics.update(lora_r=None, lora_alpha=None, target_modules=None)

    _save(m, tok, metrics, out)
    log.info(f"train-downstream: best epoch {best['epoch']} saved to {out}")
    return {"checkpoint": str(out), "best_epoch": best["epoch"], "metrics": history,
            "initial": initial, "lora": bool(lora)}
