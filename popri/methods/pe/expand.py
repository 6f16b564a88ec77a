"""PrE-Text's ``Expand``: an LLM turns the DP seed set into a large synthetic set, in shards.

    popri expand runs/pe/seeds.jsonl --num-samples 2000 --out runs/expand
    popri expand seeds.jsonl --num-samples 1000000 --backend vllm --model meta-llama/Llama-2-7b-hf --out runs/expand
    cat seeds.jsonl | popri expand - --num-samples 64 --shard-size 16 --out runs/x --merged-out - | wc -l

PrE-Text (pre-text.txt, Algorithm 1 line 11, Section 3 (6), Figure 3, appendix D.2): for every
synthetic sample, 3 random texts of the DP seed set go into the few-shot prompt "List of 6 diverse
original text samples: / Original Text Sample 1..3 / Original Text Sample 4" and LLaMA-2-7B
(top_p 1.0, temperature 1.0, vLLM) writes sample 4; 2 million samples.  Post-processing of DP
output: spends no privacy.  Prompts, sampling backends, cleaning and degeneracy checks are
``popri.models.generation``'s (the code behind ``popri gen``).

Here degenerate samples (empty, < ``min_words`` words, repetitive, copies of a prompt example)
and exact duplicates (after whitespace normalisation, against every sample already written) are
DROPPED, and prompting goes on until N samples are kept.  Memory stays bounded: rows are written
shard by shard (``shard-00000.jsonl``, ..., each atomically) and the duplicate check keeps an
8-byte blake2b hash per kept sample in a sorted numpy array (8 MB per million).

Determinism and resume: shard k's prompts and samples depend only on (seed, k) and the hashes of
the shards before it; ``manifest.json`` (rewritten atomically after each shard) lists the
finished shards with their sha256, so rerunning the same command after a kill continues after the
last finished shard and gives byte-identical files.  Within shard k, chunk c of at most
``batch_size`` prompts draws its examples with ``derive_seed(seed, k, c)`` and sample i with the
backend's per-row seed ``derive_seed(seed, k, c, i)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from popri.models import generation
from popri.core import log
from popri.core.errors import InputError, PopriError
from popri.core.io import STDIO, atomic_write, dumps, write_json

FORMAT = "popri-expand/1"
MANIFEST = "manifest.json"
SHARD_RE = re.compile(r"shard-(\d+)\.jsonl")
SHOTS = 3                 # PrE-Text: 3 examples per prompt
MIN_YIELD = 0.05          # floor of the kept/prompted estimate that sizes the next chunk
DEFAULT_BATCH = {"transformers": 8, "vllm": 2048}
# options that change what a shard contains: a rerun must match the manifest on all of them
IDENTITY_KEYS = ("seeds_sha256", "model", "adapter", "adapter_sha256", "adapter_mode", "backend",
                 "seed", "shard_size", "batch_size", "temperature", "top_p", "max_new_tokens",
                 "max_tokens", "min_words", "template_sha256", "bf16", "attempt_factor")


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.jsonl"


def text_hash(text: str) -> int:
    """64-bit blake2b of the (already whitespace-normalised) text."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


class HashSet:
    """A set of 64-bit hashes: a sorted uint64 array (8 bytes each) plus a small pending set
    that :meth:`flush` merges in (once per shard)."""

    def __init__(self) -> None:
        self.sorted = np.empty(0, dtype=np.uint64)
        self.pending: set[int] = set()

    def __contains__(self, h: int) -> bool:
        if h in self.pending:
            return True
        a = self.sorted
        i = int(np.searchsorted(a, np.uint64(h)))
        return i < a.size and int(a[i]) == h

    def add(self, h: int) -> None:
        self.pending.add(h)

    def flush(self) -> None:
        if self.pending:
            new = np.fromiter(self.pending, dtype=np.uint64, count=len(self.pending))
            self.sorted = np.union1d(self.sorted, new)
            self.pending.clear()

    def __len__(self) -> int:
        return int(self.sorted.size) + len(self.pending)


def plan(num_samples: int, shard_size: int) -> list[int]:
    """Rows wanted per shard: full shards, the last one holding the remainder."""
    full, rest = divmod(num_samples, shard_size)
    return [shard_size] * full + ([rest] if rest else [])


# --------------------------------------------------------------------------- inputs
def seed_pool(records: Sequence[dict]) -> tuple[list[str], list, str]:
    """Distinct whitespace-normalised texts with the id of their first row, and a sha256 of the
    records (ids and texts as given) that identifies the seed set in the manifest."""
    h = hashlib.sha256()
    seen: dict[str, object] = {}
    for r in records:
        h.update((dumps([r["id"], r["text"]]) + "\n").encode("utf-8"))
        t = generation.normalise_ws(r["text"])
        if t and t not in seen:
            seen[t] = r["id"]
    return list(seen), list(seen.values()), h.hexdigest()


def dir_sha256(path: str) -> str:
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(root.rglob("*")):
        if f.is_file():
            h.update(f"{f.relative_to(root)}:".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- engines
def make_engine(backend: str, model: str, adapter: str | None, *, seed: int, params: dict,
                batch_size: int, bf16: bool, device: str | None, adapter_mode: str,
                pool: Sequence[str], template: str):
    """The generation backend of ``popri gen`` (loaded once, reused for every shard), with its
    tokenizer as ``.tok`` (for truncation to ``max_tokens``)."""
    if backend == "vllm":
        generation._import_vllm()  # a missing vllm is reported before any model is fetched
        from popri.models import llm

        tok = llm.load_tokenizer(model)
        # the context a prompt can need: the template with the 3 longest seeds, + new tokens
        lens = sorted((len(tok(t, add_special_tokens=False)["input_ids"]) for t in pool),
                      reverse=True)
        frame = len(tok(generation.fill_template(template, [""] * SHOTS))["input_ids"])
        need = frame + sum(lens[:SHOTS]) + SHOTS + params["max_new_tokens"]
        eng = generation.VllmBackend(model, adapter, bf16=bf16, params=params, seed=seed,
                                     marker=generation.MARKER, adapter_mode=adapter_mode,
                                     max_model_len=64 * math.ceil(need / 64))
        eng.tok = tok
        return eng
    return generation.TransformersBackend(model, adapter, device=device, bf16=bf16, params=params,
                                          batch_size=batch_size, seed=seed,
                                          marker=generation.MARKER)


# --------------------------------------------------------------------------- one shard
def run_shard(k: int, quota: int, *, engine, pool: Sequence[str], pool_ids: Sequence,
              template: str, cfg: dict, seen: HashSet, on_chunk: Callable[[int, int], None],
              tick: Callable[[int, int], None]) -> tuple[list[dict], dict]:
    """Shard k: prompt in chunks until ``quota`` new, clean, non-degenerate, unseen samples are
    kept or ``attempt_factor * quota`` prompts are spent.  Adds the kept hashes to ``seen``."""
    tok = getattr(engine, "tok", None)
    cap = max(quota, math.ceil(cfg["attempt_factor"] * quota))
    rows: list[dict] = []
    filtered: Counter = Counter()
    dup = surplus = prompted = tokens = 0
    extra = {"adapter": cfg["adapter"]} if cfg["adapter"] else {}
    t0 = time.perf_counter()
    c = 0
    while len(rows) < quota and prompted < cap:
        need = quota - len(rows)
        yld = max(len(rows) / prompted, MIN_YIELD) if prompted else 1.0
        m = min(cfg["batch_size"], cap - prompted, max(1, math.ceil(need / yld)))
        ps = generation.build_prompts(pool, m, seed=generation.derive_seed(cfg["seed"], k, c),
                                      shots=SHOTS, template=template, ids=pool_ids)
        raw = engine.run([p["prompt"] for p in ps], [(c, i) for i in range(m)], k, tick)
        if len(raw) != m:
            raise PopriError(f"the {engine.name} backend returned {len(raw)} outputs for "
                             f"{m} prompts")
        prompted += m
        before = len(rows)
        for p, (r, n) in zip(ps, raw):
            tokens += int(n)
            if len(rows) >= quota:
                surplus += 1
                continue
            text = generation.clean_generation(r, tok, cfg["max_tokens"], generation.MARKER)
            why = generation.degeneracy(text, min_words=cfg["min_words"], prompt=p["prompt"],
                                        examples=p["example_texts"])
            if why:
                filtered[why] += 1
                continue
            h = text_hash(text)
            if h in seen:
                dup += 1
                continue
            seen.add(h)
            rows.append({"id": f"x{k * cfg['shard_size'] + len(rows)}", "text": text,
                         "seed_ids": list(p["examples"]), "model": cfg["model"], **extra})
        on_chunk(len(rows) - before, m)
        c += 1
    stats = {"index": k, "file": shard_name(k), "quota": quota, "rows": len(rows),
             "prompts": prompted, "filtered": dict(sorted(filtered.items())), "duplicates": dup,
             "surplus": surplus, "tokens": tokens,
             "seconds": round(time.perf_counter() - t0, 3)}
    return rows, stats


# --------------------------------------------------------------------------- the run directory
def _check_identity(old: dict, new: dict, where: str) -> None:
    for key in IDENTITY_KEYS:
        if old.get(key) != new.get(key):
            raise InputError(
                f"was {old.get(key)!r}, now {new.get(key)!r}: the directory holds another "
                "expansion; rerun with its options, or give --force to start over",
                path=where, field=f"config.{key}")


def _read_done(out: Path, manifest: dict, seen: HashSet) -> list[dict]:
    """Verify the finished shards (sha256, row count) and load their hashes into ``seen``."""
    done = []
    for k, e in enumerate(manifest.get("shards", [])):
        f = out / shard_name(k)
        if e.get("file") != shard_name(k) or not f.is_file():
            raise InputError(f"{shard_name(k)}, listed as finished, is missing; --force starts "
                             "over", path=str(out / MANIFEST), field="shards")
        h = hashlib.sha256()
        n = 0
        with open(f, "rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                h.update(line)
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    raise InputError("not a shard row", path=str(f), line=lineno,
                                     field="text") from None
                seen.add(text_hash(text))
                n += 1
        if h.hexdigest() != e.get("sha256") or n != e.get("rows"):
            raise InputError("changed since it was written (sha256 differs from the manifest); "
                             "--force starts over", path=str(f))
        seen.flush()
        done.append(e)
    return done


def _clean_temps(out: Path) -> None:
    """Temp files a killed run left (atomic writes rename them only when complete)."""
    for f in out.glob(".shard-*.jsonl.*.tmp"):
        f.unlink(missing_ok=True)
    for f in out.glob(f".{MANIFEST}.*.tmp"):
        f.unlink(missing_ok=True)


def _remove_shards(out: Path, keep: int) -> None:
    for f in out.glob("shard-*.jsonl"):
        m = SHARD_RE.fullmatch(f.name)
        if m and int(m.group(1)) >= keep:
            f.unlink()


def _totals(manifest: dict) -> dict:
    sh = manifest["shards"]
    filt: Counter = Counter()
    for e in sh:
        filt.update(e["filtered"])
    secs = sum(e["seconds"] for e in sh)
    toks = sum(e["tokens"] for e in sh)
    rows = sum(e["rows"] for e in sh)
    return {"rows": rows, "shards_done": len(sh),
            "counts": {"prompts": sum(e["prompts"] for e in sh), "kept": rows,
                       "filtered": dict(sorted(filt.items())),
                       "duplicates": sum(e["duplicates"] for e in sh),
                       "surplus": sum(e["surplus"] for e in sh)},
            "generated_tokens": toks, "seconds": round(secs, 3),
            "tokens_per_s": round(toks / secs, 3) if secs else None,
            "samples_per_s": round(rows / secs, 3) if secs else None}


# --------------------------------------------------------------------------- driver
def expand(records: Sequence[dict], *, num_samples: int, out_dir: str, model: str,
           adapter: str | None = None, backend: str = "transformers", seed: int = 0,
           shard_size: int = 10000, batch_size: int | None = None, temperature: float = 1.0,
           top_p: float = 1.0, max_new_tokens: int = 85, max_tokens: int = 64,
           min_words: int = 4, template: str | None = None, bf16: bool = True,
           device: str | None = None, adapter_mode: str = "lora", attempt_factor: float = 3.0,
           force: bool = False, source: str = "", engine=None) -> dict:
    """Expand ``records`` (dicts with ``id``, ``text``: the DP seed set) into ``num_samples``
    samples under ``out_dir``; returns the final manifest (``status`` complete or short).

    ``engine`` (tests): an object with ``run(prompts, keys, attempt, tick) -> [(text, n_tokens)]``,
    ``name`` and ``tok`` used instead of loading ``model``.
    """
    if backend not in generation.BACKENDS:
        raise InputError(f"unknown backend {backend!r}; one of {', '.join(generation.BACKENDS)}",
                         field="backend")
    if num_samples < 1 or shard_size < 1 or max_tokens < 1 or max_new_tokens < 1:
        raise InputError("--num-samples, --shard-size, --max-tokens and --max-new-tokens must "
                         "be >= 1")
    if not 1 <= attempt_factor <= 1e6:  # it multiplies the shard size into a prompt count
        raise InputError(f"must be in [1, 1e6] (got {attempt_factor})", field="attempt-factor")
    if temperature < 0 or not 0 < top_p <= 1:
        raise InputError("temperature must be >= 0 and top-p in (0, 1]", field="top-p")
    template = generation.DEFAULT_TEMPLATE if template is None else template
    generation.check_template(template, SHOTS)
    pool, pool_ids, seeds_sha = seed_pool(records)
    if len(pool) < SHOTS:
        raise InputError(f"the seed set has {len(pool)} distinct non-empty texts; each prompt "
                         f"needs {SHOTS}", path=source or None, field="text")
    batch_size = batch_size or DEFAULT_BATCH[backend]
    cfg = {"seeds_sha256": seeds_sha, "model": model, "adapter": adapter,
           "adapter_sha256": dir_sha256(adapter) if adapter else None,
           "adapter_mode": adapter_mode if adapter and backend == "vllm" else None,
           "backend": backend, "seed": int(seed), "shard_size": int(shard_size),
           "batch_size": int(batch_size), "temperature": float(temperature),
           "top_p": float(top_p), "max_new_tokens": int(max_new_tokens),
           "max_tokens": int(max_tokens), "min_words": int(min_words),
           "template_sha256": hashlib.sha256(template.encode()).hexdigest(), "bf16": bool(bf16),
           "attempt_factor": float(attempt_factor)}
    out = Path(out_dir)
    mpath = out / MANIFEST
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", path=str(out))
    quotas = plan(num_samples, shard_size)
    seen = HashSet()
    done: list[dict] = []
    fresh = True
    if mpath.exists() and not force:
        from popri.core.io import read_json

        old = read_json(mpath)
        if not isinstance(old, dict) or old.get("format") != FORMAT:
            raise InputError(f"not a {FORMAT} manifest; --force starts over", path=str(mpath))
        _check_identity(old.get("config", {}), cfg, str(mpath))
        for k, e in enumerate(old.get("shards", [])):
            if k >= len(quotas):
                raise InputError(
                    f"was {old.get('num_samples')}, now {num_samples}: the directory already "
                    f"holds {k + 1} or more shards; --force starts over",
                    path=str(mpath), field="num_samples")
            if e.get("quota") != quotas[k]:
                raise InputError(
                    f"was {old.get('num_samples')}, now {num_samples}: shard {k} was cut to "
                    f"{e.get('quota')} rows for the old value; --force starts over",
                    path=str(mpath), field="num_samples")
        done = _read_done(out, old, seen)
        fresh = False
    elif out.is_dir() and not force and any(SHARD_RE.fullmatch(f.name) for f in out.iterdir()):
        raise InputError(f"has shard files but no {MANIFEST}; --force starts over", path=str(out))

    manifest = {"format": FORMAT, "status": "running", "num_samples": int(num_samples),
                "config": cfg,
                "seeds": {"path": source, "rows": len(records), "distinct": len(pool)},
                "shards": done}
    short = bool(done) and done[-1]["rows"] < done[-1]["quota"]
    todo = [] if short else list(range(len(done), len(quotas)))
    if todo and engine is None:
        params = {"temperature": float(temperature), "top_p": float(top_p),
                  "max_new_tokens": int(max_new_tokens)}
        engine = make_engine(backend, model, adapter, seed=seed, params=params,
                             batch_size=batch_size, bf16=bf16, device=device,
                             adapter_mode=adapter_mode, pool=pool, template=template)
    if todo or fresh:
        out.mkdir(parents=True, exist_ok=True)
        _clean_temps(out)
        write_json({**manifest, **_totals(manifest)}, mpath)
        if fresh:
            _remove_shards(out, 0)
    if done:
        log.info(f"expand: resuming after {len(done)} finished shard(s) "
                 f"({sum(e['rows'] for e in done)} samples) in {out}")

    t0 = time.perf_counter()
    stat = {"kept": 0, "tokens": 0}
    with log.progress() as prog:
        task = prog.add_task("expand", total=num_samples,
                             completed=sum(e["rows"] for e in done))

        def tick(n_rows: int, n_tokens: int) -> None:
            stat["tokens"] += n_tokens

        def on_chunk(kept: int, prompted: int) -> None:
            stat["kept"] += kept
            dt = max(time.perf_counter() - t0, 1e-9)
            prog.update(task, advance=kept, description=(
                f"expand {stat['kept'] / dt:,.1f} samples/s {stat['tokens'] / dt:,.0f} tok/s"))

        for k in todo:
            rows, st = run_shard(k, quotas[k], engine=engine, pool=pool, pool_ids=pool_ids,
                                 template=template, cfg=cfg, seen=seen, on_chunk=on_chunk,
                                 tick=tick)
            buf = "".join(dumps(r) + "\n" for r in rows).encode("utf-8")
            with atomic_write(out / shard_name(k), "wb") as fh:
                fh.write(buf)
            st["sha256"] = hashlib.sha256(buf).hexdigest()
            seen.flush()
            manifest["shards"].append(st)
            if st["rows"] < st["quota"]:
                short = True
            manifest["status"] = "short" if short else (
                "complete" if k == len(quotas) - 1 else "running")
            write_json({**manifest, **_totals(manifest)}, mpath)
            log.info(f"expand: {shard_name(k)}: {st['rows']}/{st['quota']} samples from "
                     f"{st['prompts']} prompts; filtered {st['filtered'] or 0}, "
                     f"{st['duplicates']} duplicates; {st['seconds']:.1f}s")
            if short:
                break
    manifest["status"] = "short" if short else "complete"
    final = {**manifest, **_totals(manifest)}
    final["shortfall"] = num_samples - final["rows"]
    if todo or fresh:
        write_json(final, mpath)
    return final


def merged_chunks(out_dir: str, manifest: dict):
    """The shards' bytes in order (text), for ``--merged-out``."""
    for e in manifest["shards"]:
        with open(Path(out_dir) / e["file"], "r", encoding="utf-8") as fh:
            while chunk := fh.read(1 << 20):
                yield chunk


def write_merged(out_dir: str, manifest: dict, dest: str) -> None:
    """All shards concatenated as one JSONL: atomically to ``dest``, or to stdout for '-'."""
    if dest == STDIO:
        for chunk in merged_chunks(out_dir, manifest):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return
    with atomic_write(dest) as fh:
        for chunk in merged_chunks(out_dir, manifest):
            fh.write(chunk)


