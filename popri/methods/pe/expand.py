"""PrE-Text's ``Expand``: an LLM turns the DP seed set into a large synthetic set, in shards.

    popri expand runs/pe/seeds.jsonl --num-samples 2000 --out runs/expand
    popri expand seeds.jsonl --num-samples 1000000 --backend vllm --model meta-llama/Llama-2-7b-hf --out runs/expand
    cat seeds.jsonl | popri expand - --num-samples 64 --shard-size 16 --out runs/x --merged-out - | wc -l

"PrE-Text: Training Language Models on Private Federated Data in the Age of LLMs" (PrE-Text,
arXiv:2406.02958), Algorithm 1 line 11, Section 3 (6), Figure 3, appendix D.2: for every synthetic
sample, 3 random texts of the DP seed set go into the few-shot prompt "List of 6 diverse original
text samples: / Original Text Sample 1..3 / Original Text Sample 4" and LLaMA-2-7B (top_p 1.0,
temperature 1.0, vLLM) writes sample 4; 2 million samples.  Post-processing of DP output: spends
no privacy.  The settings are an :class:`~popri.specs.generation.ExpandSpec`; prompts, the engine
(:func:`popri.models.generation.make_engine`), cleaning and degeneracy checks are
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

from popri.core import log, outdir
from popri.core.artifacts import dir_digest
from popri.core.errors import InputError, PopriError
from popri.core.guard import check_outputs
from popri.core.io import STDIO, atomic_write, dumps, read_json, write_json
from popri.data.records import text_records
from popri.models import generation
from popri.models.lora import require_adapter
from popri.specs.generation import ExpandSpec, GenSpec, settle

FORMAT = "popri-expand/1"
MANIFEST = "manifest.json"
SHARD_RE = re.compile(r"shard-(\d+)\.jsonl")
SHOTS = GenSpec.shots     # PrE-Text: 3 examples per prompt (as popri gen's default)
MIN_YIELD = 0.05          # floor of the kept/prompted estimate that sizes the next chunk
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


def prompt_tokens(tok, pool: Sequence[str], template: str) -> int:
    """The longest prompt ``tok`` can see: the template's frame with the 3 longest seeds (vllm's
    context is this + the new tokens, see :func:`popri.models.generation.make_engine`)."""
    lens = sorted((len(tok(t, add_special_tokens=False)["input_ids"]) for t in pool),
                  reverse=True)
    frame = len(tok(generation.fill_template(template, [""] * SHOTS))["input_ids"])
    return frame + sum(lens[:SHOTS]) + SHOTS


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


def _is_expansion(p: Path) -> bool:
    """A directory ``popri expand`` wrote: its manifest is an expansion manifest."""
    try:
        return json.loads((p / MANIFEST).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


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
def _resumed(out: Path, cfg: dict, quotas: list[int], num_samples: int, seen: HashSet, *,
             force: bool) -> list[dict] | None:
    """The finished shards of an earlier expansion in ``out`` with the same ``cfg`` and
    ``num_samples``' quotas (their texts added to ``seen``), or None: a fresh start (no
    manifest, or ``force``).  A manifest of another format, config or size is refused."""
    mpath = out / MANIFEST
    if mpath.exists() and not force:
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
        return _read_done(out, old, seen)
    if out.is_dir() and not force and any(SHARD_RE.fullmatch(f.name) for f in out.iterdir()):
        raise InputError(f"has shard files but no {MANIFEST}; --force starts over", path=str(out))
    return None


def expand(records: Sequence[dict], spec: ExpandSpec | None = None, *, num_samples: int,
           out_dir: str, adapter: str | None = None, seed: int = 0, template: str | None = None,
           device: str | None = None, force: bool = False, source: str = "", engine=None,
           **settings) -> dict:
    """Expand ``records`` (dicts with ``id``, ``text``: the DP seed set) into ``num_samples``
    samples under ``out_dir``; returns the final manifest (``status`` complete or short).

    ``spec``: an :class:`~popri.specs.generation.ExpandSpec` (its fields may also be given as
    keywords: ``expand(recs, num_samples=8, out_dir=d, model="smollm2-135m", shard_size=4)``);
    ``template``: the prompt template's text (default: the few-shot prompt of PrE-Text Figure 3).
    ``engine`` (tests): an object with ``run(prompts, keys, attempt, tick) -> [(text, n_tokens)]``,
    ``name`` and ``tok`` used instead of loading ``spec.model``.
    """
    spec = settle(ExpandSpec, spec, settings)
    if num_samples < 1:
        raise InputError(f"must be >= 1 (got {num_samples})", field="num_samples")
    template = generation.DEFAULT_TEMPLATE if template is None else template
    generation.check_template(template, SHOTS)
    pool, pool_ids, seeds_sha = seed_pool(records)
    if len(pool) < SHOTS:
        raise InputError(f"the seed set has {len(pool)} distinct non-empty texts; each prompt "
                         f"needs {SHOTS}", path=source or None, field="text")
    spec = spec.replace(batch_size=spec.batch)  # the backend's batch (EXPAND_BATCH) if unset
    adapter_mode = spec.adapter_mode if adapter and spec.backend == "vllm" else None
    shard_size = spec.shard_size
    cfg = {"seeds_sha256": seeds_sha, "model": spec.model, "adapter": adapter,
           "adapter_sha256": dir_digest(adapter) if adapter else None,
           "adapter_mode": adapter_mode, "backend": spec.backend, "seed": int(seed),
           "shard_size": int(shard_size), "batch_size": int(spec.batch_size),
           "temperature": float(spec.temperature), "top_p": float(spec.top_p),
           "max_new_tokens": int(spec.max_new_tokens), "max_tokens": int(spec.max_tokens),
           "min_words": int(spec.min_words),
           "template_sha256": hashlib.sha256(template.encode()).hexdigest(),
           "bf16": bool(spec.bf16), "attempt_factor": float(spec.attempt_factor)}

    # '-', a file, a device, a link, a directory holding the seeds, and a non-empty directory
    # that is not an expansion of ours are refused (--force starts over only in ours)
    out = outdir.check(out_dir, inputs=[source or None], whole=False, legacy=_is_expansion)
    mpath = out / MANIFEST
    quotas = plan(num_samples, shard_size)
    seen = HashSet()
    done = _resumed(out, cfg, quotas, num_samples, seen, force=force)
    fresh = done is None
    done = done or []

    manifest = {"format": FORMAT, "status": "running", "num_samples": int(num_samples),
                "config": cfg,
                "seeds": {"path": source, "rows": len(records), "distinct": len(pool)},
                "shards": done}
    short = bool(done) and done[-1]["rows"] < done[-1]["quota"]
    todo = [] if short else list(range(len(done), len(quotas)))
    if todo and engine is None:  # loaded once, reused for every shard
        engine = generation.make_engine(
            spec, adapter=adapter, seed=seed, marker=generation.MARKER, device=device,
            prompt_tokens=lambda tok: prompt_tokens(tok, pool, template))
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


def expand_file(seeds: str, spec: ExpandSpec, *, num_samples: int, out: str,
                adapter: str | None = None, seed: int = 0, template: str | None = None,
                device: str | None = None, merged_out: str | None = None, force: bool = False,
                allow_short: bool = False) -> dict:
    """The ``popri expand`` step: the seed set at ``seeds`` (JSONL, a dataset directory, or '-')
    -> ``num_samples`` samples in shards under the directory ``out`` (+ all of them as one JSONL
    at ``merged_out``, '-': stdout), ``template`` a prompt template FILE.  Every input and output
    is checked before a model loads.  A shortfall (fewer than N kept after ``attempt_factor`` x
    the prompts) is a PopriError (exit 1) unless ``allow_short`` (then a warning).  Returns the
    final manifest."""
    if adapter:
        require_adapter(adapter)
    if out == STDIO:
        raise InputError("--out is a directory; use --merged-out - for stdout", field="out")
    # --out DIR's files: its manifest and shards (--force removes those there; a shard name
    # that --merged-out would take is one it will write)
    shards = {str(f) for f in Path(out).glob("shard-*.jsonl") if SHARD_RE.fullmatch(f.name)}
    if merged_out and merged_out != STDIO and SHARD_RE.fullmatch(Path(merged_out).name):
        shards.add(str(Path(out) / Path(merged_out).name))
    check_outputs([out, str(Path(out) / MANIFEST), *sorted(shards), merged_out],
                  [seeds, template, adapter, spec.model if Path(spec.model).exists() else None])
    tmpl = generation.read_template(template, lambda t: generation.check_template(t, SHOTS))

    recs, src = text_records(seeds)
    manifest = expand(recs, spec, num_samples=num_samples, out_dir=out, adapter=adapter,
                      seed=seed, template=tmpl, device=device, force=force, source=src)
    c = manifest["counts"]
    rate = manifest["samples_per_s"]
    log.info(f"expand: {manifest['rows']}/{num_samples} samples in {manifest['shards_done']} "
             f"shard(s) under {out}; {c['prompts']} prompts, filtered {c['filtered'] or 0}, "
             f"{c['duplicates']} duplicates; {rate if rate is not None else 0:.2f} samples/s, "
             f"{manifest['tokens_per_s'] or 0:.1f} tokens/s")
    if manifest["status"] == "short":
        msg = (f"shortfall: {manifest['rows']} of {num_samples} samples after "
               f"--attempt-factor {spec.attempt_factor:g} x the prompts of the last shard "
               f"(see {Path(out) / MANIFEST})")
        if not allow_short:
            raise PopriError(msg + "; --allow-short accepts it")
        log.warn(msg)
    if merged_out:
        write_merged(out, manifest, merged_out)
    return manifest
