#!/usr/bin/env bash
# One POPri round by hand, the stages joined by pipes (what `popri run` does per round):
#
#   gen -> score -> prefs build -> dpo -> gen again with the adapter -> eval fid
#
#   bash examples/popri_round.sh [RUN_DIR]      # ~5-8 minutes on a 2-core CPU
#
# Offline: private clients are State of the Union addresses from 1900 on; the public initial
# population Omega is the addresses before 1900; the generator is SmolLM2-135M-Instruct.
set -euo pipefail

RUN=${1:-runs/round-by-hand}
SEED=${SEED:-0}
K=${K:-8}                        # prompts
J=${J:-6}                        # samples per prompt
Z=${Z:-2.0}                      # noise multiplier (popri account sigma gives it for a budget)
L=${L:-50}                       # clients per round
mkdir -p "$RUN/round1"

popri bench fetch sotu --out "$RUN/private" --date-from 1900-01-01 --max-samples-per-client 16 --seed "$SEED"
popri bench fetch sotu --out "$RUN/public" --date-to 1899-12-31 --max-samples-per-client 8 --seed "$SEED"
popri embed "$RUN/private" --split train --out "$RUN/private.npy"
popri embed "$RUN/private" --split val --out "$RUN/val.npy"

# the LLM writes K x J samples; the clients score them straight off the pipe (tee keeps a copy)
popri gen "$RUN/public" --split train --prompts "$K" --samples-per-prompt "$J" --round 1 \
    --seed "$SEED" --prompts-out "$RUN/round1/prompts.jsonl" \
  | tee "$RUN/round1/samples.jsonl" \
  | popri score --mode cosine --synthetic - --private "$RUN/private.npy" --noise-multiplier "$Z" \
      --clients-per-round "$L" --seed "$SEED" --round 1 --out "$RUN/round1/scores.npy"

# chosen = best, rejected = 5th best of each prompt; DPO on them with a LoRA adapter
popri prefs build --samples "$RUN/round1/samples.jsonl" --scores "$RUN/round1/scores.npy" \
    --rejected-rank 5 --out "$RUN/round1/prefs.jsonl"
popri dpo --pairs "$RUN/round1/prefs.jsonl" --model smollm2-135m --out "$RUN/round1/dpo" \
    --epochs 2 --batch-size 4 --seed "$SEED"

# how close are samples before and after the round to the validation split?
for name in base tuned; do
  adapter=(); [ "$name" = tuned ] && adapter=(--adapter "$RUN/round1/dpo/adapter")
  popri gen "$RUN/public" --split train --prompts 12 --samples-per-prompt 2 --round 2 \
      --seed "$((SEED + 1))" "${adapter[@]}" \
    | popri eval fid - "$RUN/val.npy" --json \
    | python3 -c "import json,sys; print('FID to val ($name):', round(json.load(sys.stdin)['fid'], 4))"
done
popri account ledger "$RUN/round1"
