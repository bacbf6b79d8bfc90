#!/usr/bin/env bash
# Issue 16, part 4: what limits the dflash drafter on the v2 data: steps or data? The dflash-layout drafter of
# recipes/smollm2_drafters_v2.sh, on all 1,092 training rows (183k response tokens), for STEPS steps (default 1500:
# about 9 passes over the data) instead of 300. Its log holds the held-out curve every 50 steps; if it flattens or
# falls while the training loss keeps falling, the data is what runs out. Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v2}
DATA=${DATA:-$RUN/data_greedy}
STEPS=${STEPS:-1500}
OUT=${OUT:-$RUN/drafters/dflash-steps$STEPS}

hf-specdiff train --verifier smollm2-135m-instruct --data "$DATA" --objective ce-streak --verifier-layers auto \
    --block-size 16 --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 50 --max-steps "$STEPS" --save-every 100 \
    --eval-every 50 --draft-vocab-size 8192 --precision fp32 --eval-fraction 0.08 --feature-cache true \
    --layout dflash --num-hidden-layers 3 --mask-token-id 16 --out "$OUT"
python experiments/held_out_acceptance.py "$RUN/kl/ce-streak" "$OUT" --out "docs/results/smollm2-v2/dflash_steps$STEPS.json"
python experiments/learning_curves.py "$RUN/kl/ce-streak" "$OUT" --out "docs/results/smollm2-v2/steps$STEPS"
