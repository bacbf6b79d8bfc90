#!/usr/bin/env bash
# Issue 16, part 3: does the verifier's distribution help, and how should the KL term weigh block positions?
# Three dflash-layout drafters at equal data (the v2 greedy set, recipes/smollm2_data_v2.sh) and equal steps:
# ce-streak alone, + KL(verifier || drafter) weighted uniformly over block positions, + KL weighted by the
# probability that the drafter's streak reaches each position. The KL term reads the verifier's top-64 next tokens,
# cached once beside the features (no verifier forward per step). Then held-out acceptance on a large sample of
# the held-out rows (experiments/held_out_acceptance.py). Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v2}
DATA=${DATA:-$RUN/data_greedy}
STEPS=${STEPS:-300}
OUT=${OUT:-$RUN/kl}
KL=${KL:-1.0}

COMMON="--verifier smollm2-135m-instruct --data $DATA --objective ce-streak --verifier-layers auto --block-size 16
    --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 50 --max-steps $STEPS --save-every 100 --eval-every 50
    --draft-vocab-size 8192 --precision fp32 --eval-fraction 0.08 --feature-cache true
    --layout dflash --num-hidden-layers 3 --mask-token-id 16"
hf-specdiff train $COMMON --kl-weight 0 --out "$OUT/ce-streak"
hf-specdiff train $COMMON --kl-weight "$KL" --kl-weighting uniform --out "$OUT/kl-uniform"
hf-specdiff train $COMMON --kl-weight "$KL" --kl-weighting streak --out "$OUT/kl-streak"
python experiments/held_out_acceptance.py "$OUT/ce-streak" "$OUT/kl-uniform" "$OUT/kl-streak" \
    --out docs/results/smollm2-v2/kl_weighting.json
