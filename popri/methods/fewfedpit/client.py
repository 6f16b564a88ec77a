"""FewFedPIT's client side: private training, self-generation with its filters, training on the
synthetic set (Algorithm 1, lines 6-8), and the weights directories the stages pass around.

    popri fewfedpit local   --data D --client C --round 1 --model smollm2-135m --out R1/C/local
    popri fewfedpit selfgen --data D --client C --round 1 --model smollm2-135m --local R1/C/local --out R1/C/syn.jsonl
    popri fewfedpit train   --synthetic R1/C/syn.jsonl --round 1 --model smollm2-135m --out R1/C/public

"FewFedPIT: Towards Privacy-preserving and Few-shot Federated Instruction Tuning"
(arXiv:2403.06131):

- **local** (line 6): W^l = LocTrain(D_k, W^g_{r-1}): AdamW on the client's examples from the
  global weights, loss on the response tokens (+ EOS) only, the Alpaca prompt as context;
- **selfgen** (line 7, section 3.3): the global model M^g writes new instructions from 8 random
  local ones (greedy), which pass the format and Rouge-L filters until 2M remain; then an input
  and a response for each from a 4-shot prompt (at most 3 tries), the copy filter, and the IFS
  of each candidate under the local model M^l; the M lowest are kept
  (:mod:`popri.methods.fewfedpit.filters`, :mod:`popri.methods.fewfedpit.ifs`);
- **train** (line 8): W^g_k = LocTrain(D^syn_k, W^g_{r-1}): the same training on the kept
  synthetic examples (``fedmit``: on the private and synthetic examples together).

A weights directory holds ``theta.npy`` (the LoRA weights as one float32 vector, the order of
the model's trainable parameters) and ``state.json`` (what made it: kind, round, client, base
model, LoRA settings, examples n_k, seconds).  The model is rebuilt from the base model and a
LoRA adapter initialised from the run's seed, so round 1's global weights are W^g_0 = that
adapter (B = 0: the base model's function).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

from popri.core import log, outdir, runtime
from popri.core.errors import InputError
from popri.core.io import (
    STDIO,
    AtomicOutputs,
    dumps,
    iter_jsonl,
    load_npy,
    read_json,
    write_json,
    write_jsonl,
)
from popri.data.instruct import check_example, read_examples
from popri.data.instruct import prompt as alpaca
from popri.eval.downstream import load_model
from popri.federated.updates import clip, flat, set_flat, trainable
from popri.methods.fewfedpit import filters as F
from popri.methods.fewfedpit.ifs import response_losses
from popri.methods.fewfedpit.weights import mix
from popri.models import llm
from popri.models.instruct import encode, greedy_texts  # noqa: F401
from popri.models.llm import autocast, recorded_name
from popri.models.lora import lora_config
from popri.specs.fewfedpit import FewFedPITSpec

THETA = "theta.npy"
STATE = "state.json"
KINDS = ("global", "local", "public", "mixed")
_LORA_KEYS = ("lora_r", "lora_alpha", "target_modules")


# --------------------------------------------------------------------------- data
def client_examples(data: str, split: str, client: str | None) -> tuple[list[dict], str]:
    """The instruction records (instruction / input / output) of one client (all with None),
    each checked (:func:`popri.data.instruct.check_example`)."""
    recs, src = read_examples(data, split)
    if client is not None:
        recs = [r for r in recs if str(r.get("client_id")) == str(client)]
        if not recs:
            raise InputError(f"no records of client {client!r} in split {split!r}", path=src,
                             field="client_id")
    return recs, src


def rng_for(seed: int, round_: int, client: str, stream: str) -> random.Random:
    """The seeded source of one client-round's choices (demonstrations, data order)."""
    return random.Random(f"{seed}:{round_}:{zlib.crc32(str(client).encode())}:{stream}")


# --------------------------------------------------------------------------- weights dirs
def read_meta(path: str | os.PathLike, kinds: Sequence[str] = KINDS) -> dict:
    """The checked ``state.json`` of a weights directory (its weights not loaded): a broken,
    foreign or absurd one is one :class:`InputError` naming the file and field."""
    p = Path(path)
    if not (p / THETA).is_file() or not (p / STATE).is_file():
        raise InputError(f"not a FewFedPIT weights directory (no {THETA} / {STATE})", path=str(p))
    where = str(p / STATE)
    state = read_json(p / STATE, expect=dict)
    if state.get("kind") not in kinds:
        raise InputError(f"holds {state.get('kind')!r} weights, expected one of "
                         f"{', '.join(kinds)}", path=str(p), field="kind")
    r = state.get("round")
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise InputError(f"must be an integer >= 0 (got {r!r})", path=where, field="round")
    lora = state.get("lora")
    if not isinstance(lora, dict) or set(lora) != set(_LORA_KEYS) \
            or not all(isinstance(lora[k], int) and not isinstance(lora[k], bool) and lora[k] > 0
                       for k in ("lora_r", "lora_alpha")):
        raise InputError(f"must be an object with {', '.join(_LORA_KEYS)} (got {lora!r})",
                         path=where, field="lora")
    for k in ("base_model",):
        if not isinstance(state.get(k), str) or not state[k]:
            raise InputError("must be a non-empty string", path=where, field=k)
    seed = state.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"must be an integer >= 0 (got {seed!r})", path=where, field="seed")
    if "n_examples" in state:
        n = state["n_examples"]
        # an example count: a whole number, and one no client holds more of (2^31): a claimed
        # 1e300 would silently take all of the n_k-weighted average
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < 2**31:
            raise InputError(f"must be a whole number of examples in [1, 2^31) (got {n!r})",
                             path=where, field="n_examples")
    return state


def read_state(path: str | os.PathLike, kinds: Sequence[str] = KINDS) -> tuple[np.ndarray, dict]:
    """(theta, state) of a weights directory, checked."""
    state = read_meta(path, kinds)
    f = Path(path) / THETA
    theta = load_npy(f)
    if theta.ndim != 1 or theta.dtype.kind not in "fi" or not np.isfinite(theta).all():
        raise InputError("is not a finite real vector", path=str(f))
    return theta.astype(np.float32), state


#: the files a weights directory written before the ownership marker always holds
WEIGHTS_FILES = (THETA, STATE)


def check_out(out: str, *inputs: str | None) -> None:
    """The directory-output rule (:func:`popri.core.outdir.check`) for a weights directory:
    before anything is read or trained."""
    outdir.check(out, inputs=inputs, legacy=WEIGHTS_FILES)


def stage_files(d: Path, theta: np.ndarray, state: dict, model=None, tok=None) -> None:
    """Write a weights directory's files into ``d``: theta.npy, state.json and, with
    ``model``, ``model/`` (adapter + tokenizer + metrics.json, for eval / audit)."""
    np.save(d / THETA, theta.astype(np.float32))
    (d / STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    if model is not None:
        model.save_pretrained(d / "model")
        tok.save_pretrained(d / "model")
        meta = {"model": str(state["base_model"]),
                "base_model": recorded_name(state["base_model"]), "lora": True,
                "trainable_parameters": int(theta.size), "method": state.get("mode"),
                "round": state.get("round")}
        (d / "model" / "metrics.json").write_text(json.dumps(meta, indent=2) + "\n",
                                                  encoding="utf-8")


def write_state(out: str | os.PathLike, theta: np.ndarray, state: dict, model=None, tok=None
                ) -> None:
    """Write a weights directory atomically: staged next to it, renamed into place."""
    out_p = Path(out)
    tmp = outdir.staging_dir(out_p)
    try:
        stage_files(tmp, theta, state, model, tok)
        outdir.replace(tmp, out_p, kind=f"fewfedpit-{state['kind']}", legacy=WEIGHTS_FILES)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def lora_settings(spec: FewFedPITSpec) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in
            ((k, getattr(spec, k)) for k in _LORA_KEYS)}


def global_weights(init: str, spec: FewFedPITSpec, device: str):
    """(model, tok, params, theta_global, base_model, state) from a global weights directory
    (``fewfedpit init``: round 0, or an aggregate); the LoRA adapter is rebuilt from the seed
    recorded there, then set to its weights."""
    theta, st = read_state(init, ("global",))
    if st.get("lora") != lora_settings(spec):
        raise InputError(f"was made with LoRA {st.get('lora')}, this stage has "
                         f"{lora_settings(spec)}", path=init, field="lora_r")
    m, tok, params = build(st["base_model"], spec, int(st["seed"]), device)
    if theta.size != sum(p.numel() for p in params):
        raise InputError("the saved weights do not fit the model", path=init)
    set_flat(params, theta)
    return m, tok, params, theta, st["base_model"], st


def init_global(model: str, out: str, spec: FewFedPITSpec, *, seed: int = 0,
                device: str | None = None) -> dict:
    """W^g_0: ``model`` with a LoRA adapter initialised from ``seed`` (B = 0, so the base
    model's function), as the round-0 global weights directory ``out`` (with ``model/``)."""
    check_out(out, model if Path(model).exists() else None)
    device = device or llm.default_device()
    m, tok, params = build(model, spec, seed, device)
    state = {"kind": "global", "round": 0, "client": None, "base_model": str(model),
             "lora": lora_settings(spec), "mode": spec.mode, "seed": seed}
    write_state(out, flat(params), state, m, tok)
    log.info(f"fewfedpit init: {model} + LoRA r={spec.lora_r} (seed {seed}), "
             f"{sum(p.numel() for p in params):,} weights -> {out}")
    return state


def build(base: str, spec: FewFedPITSpec, seed: int, device: str):
    """(model, tokenizer, trainable params): ``base`` with a LoRA adapter initialised from
    ``seed`` (the same for every client and round: the weights vectors line up)."""
    torch = runtime.configure_torch()
    from peft import get_peft_model

    m, tok = load_model(base, device=device)
    if getattr(m, "peft_config", None):
        m = m.merge_and_unload()
    torch.manual_seed(seed)
    m = get_peft_model(m, lora_config(m, spec))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return m, tok, trainable(m)


# --------------------------------------------------------------------------- training
def train(model, params, theta0: np.ndarray, examples: Sequence[dict], tok, spec: FewFedPITSpec,
          *, lr: float, rng: random.Random, device: str) -> tuple[np.ndarray, dict]:
    """LocTrain: ``local_epochs`` of AdamW (batch ``batch_size``) from ``theta0`` on the
    examples' responses; returns (theta, stats)."""
    import torch

    set_flat(params, theta0)
    seqs = encode(tok, examples, spec.max_length)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    loss_sum, n_tok, steps = 0.0, 0, 0
    for _ in range(spec.local_epochs):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        for s in range(0, len(order), spec.batch_size):
            chunk = [seqs[i] for i in order[s: s + spec.batch_size]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100, dtype=torch.long)
            for j, (x, n_p) in enumerate(chunk):
                ids[j, : len(x)] = torch.tensor(x)
                mask[j, : len(x)] = 1
                labels[j, n_p: len(x)] = torch.tensor(x[n_p:])
            ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
            opt.zero_grad(set_to_none=True)
            with autocast(device, spec.bf16):
                logits = model(input_ids=ids, attention_mask=mask).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            tgt = labels[:, 1:]
            valid = tgt != -100
            nll = -logp.gather(2, tgt.clamp(min=0)[..., None])[..., 0]
            n = int(valid.sum())
            if n == 0:
                continue
            loss = (nll * valid).sum() / n
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * n
            n_tok += n
            steps += 1
    model.eval()
    return flat(params), {"loss": loss_sum / n_tok if n_tok else None, "steps": steps,
                          "tokens": n_tok, "examples": len(seqs), "lr": lr}


# --------------------------------------------------------------------------- generation
def selfgen(model, tok, params, theta_global: np.ndarray, theta_local: np.ndarray,
            local: Sequence[dict], spec: FewFedPITSpec, *, rng: random.Random, device: str
            ) -> tuple[list[dict], dict]:
    """SynGen (module docstring): returns (one row per candidate with its fate, counts).  Rows
    of kept samples have ``kept`` True; each row has ``rouge_l`` (instruction vs the local
    ones), and those that got a response ``rouge_l_local`` (copy filter) and ``ifs``."""
    counts = {"instruction_prompts": 0, "generated": 0, "format": 0, "rouge_local": 0,
              "rouge_kept": 0, "novel": 0, "no_response": 0, "copy": 0, "scored": 0, "kept": 0}
    local_instr = [e["instruction"] for e in local]
    set_flat(params, theta_global)  # M^g generates
    novel: list[str] = []
    rows: list[dict] = []
    while len(novel) < spec.candidates and counts["instruction_prompts"] < spec.instruction_prompts:
        batch = min(4, spec.instruction_prompts - counts["instruction_prompts"])
        demo_sets = [rng.sample(local_instr, min(spec.demos, len(local_instr))) for _ in range(batch)]
        gens = greedy_texts(model, tok, [F.instruction_prompt(d) for d in demo_sets],
                            spec.instruction_tokens, device=device, bf16=spec.bf16)
        counts["instruction_prompts"] += batch
        cands = [c for d, g in zip(demo_sets, gens) for c in F.parse_instructions(g, len(d) + 1)]
        counts["generated"] += len(cands)
        r, c = F.novel_instructions(cands, local_instr, spec.candidates - len(novel),
                                    spec.rouge_threshold, kept_before=novel)
        for row in r:
            if row["kept"]:
                novel.append(row["instruction"])
            else:
                rows.append({**row, "stage": "instruction"})
        for k in ("format", "rouge_local", "rouge_kept"):
            counts[k] += c[k]
    counts["novel"] = len(novel)
    # input + response, at most `retries` tries with fresh demonstrations
    pending = list(range(len(novel)))
    got: dict[int, tuple[str, str]] = {}
    for _ in range(spec.retries):
        if not pending:
            break
        prompts = [F.io_prompt(F.alternate_demos(list(local), spec.io_shots, rng), novel[i])
                   for i in pending]
        gens = greedy_texts(model, tok, prompts, spec.response_tokens, device=device,
                            bf16=spec.bf16, stop="\nInstruction:")
        still = []
        for i, g in zip(pending, gens):
            io = F.parse_io(g)
            if io is None:
                still.append(i)
            else:
                got[i] = io
        pending = still
    counts["no_response"] = len(pending)
    for i in pending:
        rows.append({"instruction": novel[i], "stage": "response", "kept": False,
                     "reason": "no_response"})
    samples = [{"instruction": novel[i], "input": got[i][0], "output": got[i][1]}
               for i in sorted(got)]
    passed, copies = F.copy_filter(samples, local, spec.rouge_threshold)
    counts["copy"] = len(copies)
    for s in copies:
        rows.append({**s, "stage": "copy", "kept": False, "reason": "copy"})
    if passed:
        set_flat(params, theta_local)  # M^l scores
        cond, uncond = response_losses(model, tok, [alpaca(s["instruction"], s["input"])
                                                    for s in passed],
                                       [s["output"] for s in passed], spec.max_length)
        for s, a, b in zip(passed, cond, uncond):
            s.update({"loss_with_prompt": float(a), "loss_without_prompt": float(b),
                      "ifs": F.ifs(a, b)})
        counts["scored"] = len(passed)
        top = {id(s) for s in F.select_top(passed, spec.keep)}
        for s in passed:
            keep = id(s) in top
            rows.append({**s, "stage": "ifs", "kept": keep, "reason": None if keep else "ifs"})
        counts["kept"] = len(top)
    for r in rows:  # the instruction's Rouge-L to the local instructions, for every row
        if r.get("rouge_l") is None and r["stage"] != "instruction":
            r["rouge_l"] = F.max_rouge_l(r["instruction"], local_instr)
    return rows, counts


def seconds_since(t0: float) -> float:
    return round(time.perf_counter() - t0, 2)


# --------------------------------------------------------------------------- the stages
def check_round(init: str, round_: int) -> None:
    """``init`` holds round r-1's global weights (read without loading them)."""
    st = read_meta(init, ("global",))
    if st.get("round") != round_ - 1:
        raise InputError(f"holds round {st.get('round')}, expected {round_ - 1} (round "
                         f"{round_} starts from round {round_ - 1}'s global weights)",
                         path=init, field="round")


def run_local(data: str, client: str | None, out: str, spec: FewFedPITSpec, *, round_: int,
              init: str, split: str = "train", save_model: bool = False,
              device: str | None = None) -> dict:
    """W^l_k: the client's private training from the global weights (Algorithm 1, line 6).
    ``client`` None: every client's examples pooled (centralised tuning, the eps = inf
    skyline); ``save_model``: also ``OUT/model`` for eval / audit."""
    t0 = time.perf_counter()
    check_out(out, data, init)
    check_round(init, round_)
    device = device or llm.default_device()
    local, src = client_examples(data, split, client)
    m, tok, params, theta_g, base, g = global_weights(init, spec, device)
    theta, st = train(m, params, theta_g, local, tok, spec, lr=spec.lr_at(round_),
                      rng=rng_for(int(g["seed"]), round_, client or "*all*", "local"),
                      device=device)
    state = {"kind": "local", "round": round_, "client": client, "base_model": base,
             "lora": lora_settings(spec), "mode": spec.mode, "seed": g["seed"],
             "n_examples": len(local), "source": src, "train": st,
             "seconds": seconds_since(t0)}
    if save_model:
        set_flat(params, theta)
    write_state(out, theta, state, m if save_model else None, tok)
    log.info(f"fewfedpit local r{round_} {client or 'all clients'}: {len(local)} examples, "
             f"{st['steps']} steps, "
             f"loss {st['loss'] if st['loss'] is not None else float('nan'):.4f} -> {out}")
    return state


def run_selfgen(data: str, client: str, out: str, spec: FewFedPITSpec, *, round_: int,
                init: str, local_dir: str, split: str = "train", stats_out: str | None = None,
                device: str | None = None) -> dict:
    """D^syn_k (Algorithm 1, line 7): every candidate with its fate to ``out`` (JSONL), the
    filter counts to ``stats_out`` (JSON)."""
    t0 = time.perf_counter()
    check_round(init, round_)
    theta_l, st_l = read_state(local_dir, ("local",))
    if st_l.get("round") != round_ or str(st_l.get("client")) != str(client):
        raise InputError(f"holds client {st_l.get('client')!r} round {st_l.get('round')}, "
                         f"expected {client!r} round {round_}", path=local_dir, field="client")
    device = device or llm.default_device()
    local, src = client_examples(data, split, client)
    m, tok, params, theta_g, base, g = global_weights(init, spec, device)
    if theta_l.shape != theta_g.shape:
        raise InputError("the local weights do not fit the global model", path=local_dir)
    rows, counts = selfgen(m, tok, params, theta_g, theta_l, local, spec,
                           rng=rng_for(int(g["seed"]), round_, client, "selfgen"), device=device)
    for i, r in enumerate(rows):
        r.update({"id": f"r{round_}/{client}/syn{i}", "client_id": client, "round": round_})
    stats = {"round": round_, "client": client, "counts": counts, "local_examples": len(local),
             "seconds": seconds_since(t0), "spec": spec.to_dict(), "source": src}
    # both files or neither: a failed --stats-out must not leave --out behind
    with AtomicOutputs() as staged:
        if out != STDIO:
            with open(staged.path(out), "w", encoding="utf-8") as fh:
                fh.writelines(dumps(r) + "\n" for r in rows)
        if stats_out and stats_out != STDIO:
            with open(staged.path(stats_out), "w", encoding="utf-8") as fh:
                fh.write(json.dumps(stats, ensure_ascii=False, indent=2) + "\n")
    if out == STDIO:
        write_jsonl(rows, out)
    if stats_out == STDIO:
        write_json(stats, stats_out)
    log.info(f"fewfedpit selfgen r{round_} {client}: {counts['generated']} instructions "
             f"generated, {counts['novel']} novel, {counts['scored']} with a response past the "
             f"copy filter, {counts['kept']} kept by IFS ({stats['seconds']:.0f}s) -> {out}")
    return stats


def kept_samples(path: str, client: str | None = None, round_: int | None = None) -> list[dict]:
    """The kept rows of a selfgen JSONL, each checked as an instruction record.  A row that
    records its ``client_id`` / ``round`` (selfgen writes both) must be of ``client`` /
    ``round_`` (when given): another client's or round's synthetic set is refused, as ``mix``
    refuses another client's or round's weights."""
    out = []
    for r in iter_jsonl(path, ("instruction", "kept"), locate=True):
        where = {"path": r.pop("_path"), "line": r.pop("_line")}
        if client is not None and r.get("client_id") is not None \
                and str(r["client_id"]) != str(client):
            raise InputError(f"a row of client {r['client_id']!r}, expected {client!r} (the "
                             "synthetic set of this client's selfgen)", field="client_id",
                             **where)
        if round_ is not None and r.get("round") is not None and r["round"] != round_:
            raise InputError(f"a row of round {r['round']!r}, expected {round_} (this round's "
                             "selfgen)", field="round", **where)
        if r["kept"] is True:
            out.append(check_example(r, **where))
    return out


def run_train(synthetic: str, client: str, out: str, spec: FewFedPITSpec, *, round_: int,
              init: str, data: str | None = None, split: str = "train",
              device: str | None = None) -> dict:
    """W^g_k: training on the kept synthetic examples from the global weights (line 8); fedmit
    (``data`` given): on the client's private examples and the synthetic ones together."""
    t0 = time.perf_counter()
    check_round(init, round_)
    device = device or llm.default_device()
    if spec.mode == "fedmit" and not data:
        raise InputError("fedmit trains one model on the private and the synthetic examples "
                         "together: give the private data (--data)", field="--data")
    syn = kept_samples(synthetic, client, round_)
    private = client_examples(data, split, client)[0] if data else []
    examples = private + syn
    m, tok, params, theta_g, base, g = global_weights(init, spec, device)
    if examples:
        theta, st = train(m, params, theta_g, examples, tok, spec, lr=spec.lr_at(round_),
                          rng=rng_for(int(g["seed"]), round_, client, "public"), device=device)
    else:  # nothing survived the filters: W^g_k = W^g_{r-1}
        theta, st = theta_g.copy(), {"loss": None, "steps": 0, "tokens": 0, "examples": 0}
        log.warn(f"fewfedpit train r{round_} {client}: no synthetic example was kept; the "
                 "public weights are the global ones")
    state = {"kind": "public", "round": round_, "client": client, "base_model": base,
             "lora": lora_settings(spec), "mode": spec.mode, "seed": g["seed"],
             "n_synthetic": len(syn), "n_private": len(private), "train": st,
             "seconds": seconds_since(t0)}
    write_state(out, theta, state)
    log.info(f"fewfedpit train r{round_} {client}: {len(syn)} synthetic"
             + (f" + {len(private)} private" if private else "") + f" examples -> {out}")
    return state


def run_mix(out: str, spec: FewFedPITSpec, *, round_: int, init: str, local_dir: str | None,
            public_dir: str | None) -> dict:
    """W^a_k = beta W^l + (1 - beta) W^g_k (line 9); fedit uploads W^l, fedmit its one model;
    with ``spec.clip`` (popri extension) the update W^a_k - W^g_{r-1} clipped to C."""
    check_out(out, init, local_dir, public_dir)
    check_round(init, round_)
    theta_g, g = read_state(init, ("global",))
    beta = spec.beta_value()
    parts = {}
    for name, d, kind in (("local", local_dir, "local"), ("public", public_dir, "public")):
        if d is not None:
            parts[name] = read_state(d, (kind,))
    need = {"fewfedpit": ("local", "public"), "fedit": ("local",), "fedmit": ("public",)}[spec.mode]
    if spec.mode == "fewfedpit" and beta == 1.0:
        need = ("local",)
    if spec.mode == "fewfedpit" and beta == 0.0:
        need = ("public",)
    for name in need:
        if name not in parts:
            raise InputError(f"{spec.mode} (beta {beta:g}) needs --{name}", field=name)
    clients = {str(st.get("client")) for _, st in parts.values()}
    rounds = {st.get("round") for _, st in parts.values()}
    if len(clients) != 1 or rounds != {round_}:
        raise InputError(f"the inputs are of clients {sorted(clients)} / rounds {sorted(rounds)}, "
                         f"expected one client in round {round_}", field="client")
    for _, st in parts.values():
        if st.get("lora") != g.get("lora"):
            raise InputError("the inputs were made with other LoRA settings than --init",
                             field="lora_r")
    (client,) = clients
    if spec.mode == "fewfedpit" and len(need) == 2:
        theta = mix(parts["local"][0], parts["public"][0], beta)
    else:
        theta = parts[need[0]][0]
    if theta.shape != theta_g.shape:
        raise InputError("the inputs do not fit --init's weights", field="init")
    norm = None
    if spec.clip is not None:
        d, norm = clip((theta.astype(np.float64) - theta_g).astype(np.float32), spec.clip)
        theta = (theta_g + d).astype(np.float32)
    n = parts["local"][1]["n_examples"] if "local" in parts else \
        parts["public"][1].get("n_private") or parts["public"][1].get("n_synthetic") or 1
    state = {"kind": "mixed", "round": round_, "client": client, "base_model": g["base_model"],
             "lora": g["lora"], "mode": spec.mode, "seed": g["seed"], "beta": beta,
             "n_examples": int(n), "update_norm": norm, "clip": spec.clip,
             "inputs": {k: str(v) for k, v in (("local", local_dir), ("public", public_dir)) if v}}
    write_state(out, theta, state)
    log.info(f"fewfedpit mix r{round_} {client}: {spec.mode}, beta {beta:g}"
             + (f", update norm {norm:.4g} clipped to {spec.clip:g}" if norm is not None else "")
             + f" -> {out}")
    return state
