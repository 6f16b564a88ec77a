"""The server LLM writes K prompts x J samples: the ``popri gen`` step.

    popri gen data/c4-init.jsonl --prompts 1800 --samples-per-prompt 10 --seed 0 --out r0.jsonl
    python -c "from popri.models.generation import build_prompts; print(build_prompts(['a b', 'c d', 'e f'], 1, seed=0)[0]['prompt'])"

This is Algorithm 1 line 3 of "Private Federated Learning using Preference-Optimized Synthetic
Data" (POPri, arXiv:2504.16438) and the generation inside ``Expand`` of "PrE-Text: Training
Language Models on Private Federated Data in the Age of LLMs" (PrE-Text, arXiv:2406.02958).

Degenerate samples (see :func:`degeneracy`) are regenerated up to ``max_retries`` times; one
still degenerate afterwards is KEPT with ``"degenerate": true`` so that every prompt keeps
exactly J samples (preference pairs need a fixed J).  The settings are a
:class:`~popri.specs.generation.GenSpec` (sampling defaults: the POPri reference code's,
temperature 1.0, top-p 1.0, no top-k, 85 new tokens).  :func:`generate` samples a list of
prompts; :func:`generate_file` is the whole ``popri gen`` step.

Split by job (issue 38); every name stays importable from here:

    popri.models.prompts    few-shot prompts, cleaning, the degeneracy check
    popri.models.sampling   per-row seeded samplers (torch.Generator; counter-based Philox)
    popri.models.decoding   popri's decoding loop (the CPU default), DecodeOptions
    popri.models.slots      the slot engine: static cache, continuous batching, CUDA graphs
    popri.models.backends   transformers / transformers-generate / vllm backends, make_engine
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

from popri.core import log
from popri.core.errors import InputError
from popri.core.guard import check_outputs
from popri.core.io import STDIO, AtomicOutputs, dumps, write_jsonl
from popri.data.records import text_records
from popri.models import backends  # noqa: F401
from popri.models.backends import (  # noqa: F401
    MarkerStop,
    TransformersBackend,
    VllmBackend,
    import_vllm,
    adapter_rank,
    make_engine,
    sampling_params,
)
from popri.models.decoding import DecodeOptions  # noqa: F401
from popri.models.lora import (
    merged_checkpoint,  # noqa: F401
    require_adapter,
)

# the split's names, importable from here as before (issue 38)
from popri.models.prompts import (  # noqa: F401
    COPY_WORDS,
    DEFAULT_TEMPLATE,
    LOOP_MIN_WORDS,
    LOOP_TRIGRAM_SHARE,
    TOP_WORD_SHARE,
    build_prompts,
    check_template,
    clean_generation,
    cut_at_marker,
    degeneracy,
    fill_template,
    normalise_ws,
    read_template,
    template_fields,
    truncate_tokens,
)
from popri.models.sampling import CounterSampler, RowSampler, Sampler, derive_seed  # noqa: F401
from popri.specs.generation import MARKER, GenSpec, settle  # noqa: F401 (MARKER: re-export)


# --------------------------------------------------------------------------- driver
def generate(prompts: list[dict], spec: GenSpec | None = None, *, adapter: str | None = None,
             round_no: int = 0, seed: int = 0, device: str | None = None, model_obj=None,
             tokenizer_obj=None, num_samples: int | None = None,
             max_model_len: int | None = None, clean=None, decode=None,
             **settings) -> tuple[list[dict], dict]:
    """Sample ``spec.samples_per_prompt`` texts per prompt -> (records, stats).

    ``spec``: a :class:`~popri.specs.generation.GenSpec` (default: its defaults); its fields may
    also be given as keywords (``generate(prompts, model="smollm2-135m", temperature=0.7)``).
    Records (ordered by prompt, then sample): ``{"id": "r{round_no}-p{prompt_id}-s{sample_idx}",
    "round", "prompt_id", "sample_idx", "prompt", "text", "model"}`` plus ``"adapter"`` when one
    is used and ``"degenerate": true`` for a sample still degenerate after ``max_retries``.
    ``num_samples`` keeps only the first N of the K*J grid.  ``model_obj``/``tokenizer_obj``
    reuse a loaded model (an ``vllm.LLM`` for the vllm backend).  ``clean(raw, tokenizer,
    max_tokens, marker)`` replaces :func:`clean_generation` (the degeneracy check sees its result).
    ``decode``: the ``transformers`` backend's :class:`~popri.models.decoding.DecodeOptions` (or
    its text; default: by device).
    """
    spec = settle(GenSpec, spec, settings)
    J, marker, max_tokens = spec.samples_per_prompt, spec.marker, spec.max_tokens
    rows = [(i, j) for i in range(len(prompts)) for j in range(J)]
    if num_samples is not None:
        rows = rows[:num_samples]
    t_load = time.perf_counter()
    engine = make_engine(
        spec, adapter=adapter, seed=seed, marker=marker, device=device, model_obj=model_obj,
        tokenizer_obj=tokenizer_obj, max_model_len=max_model_len, decode=decode,
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
    if hasattr(engine, "asked_again"):  # --backend openai: rows a server's answer to n lacked
        stats["rows_asked_again"] = int(engine.asked_again)
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
    if (prompts is None) == (num_samples is None):
        raise InputError("give exactly one of --prompts K and --num-samples N", field="prompts")
    if adapter:
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
