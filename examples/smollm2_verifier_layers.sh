#!/usr/bin/env bash
# Issue 16: does the dflash drafter gain from reading more verifier layers? Two 3-layer dflash drafters at equal data
# and steps (ce-streak, features cached): the verifier's layers 1,14,28 ('auto') against five, 1,8,14,21,28 (as
# DFlash reads five), on the snapshot of the first ROWS v3 greedy rows that examples/smollm2_init_layers.sh makes
# (its random-layers run is the 'auto' one). Then held-out acceptance on one shared sample of windows.
# Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
ROWS=${ROWS:-512}
STEPS=${STEPS:-300}
DATA=$RUN/data_greedy_first$ROWS
OUT=${OUT:-$RUN/init_layers}

[ -f "$OUT/random-layers/model.safetensors" ] || RUN=$RUN ROWS=$ROWS STEPS=$STEPS OUT=$OUT bash examples/smollm2_init_layers.sh
hf-specdiff train --verifier smollm2-135m-instruct --data "$DATA" --objective ce-streak --verifier-layers 1,8,14,21,28 \
    --block-size 16 --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 50 --max-steps "$STEPS" --save-every 100 \
    --eval-every 50 --draft-vocab-size 8192 --precision fp32 --eval-fraction 0.08 --feature-cache true \
    --layout dflash --num-hidden-layers 3 --mask-token-id 16 --out "$OUT/five-verifier-layers"
python examples/held_out_acceptance.py "$OUT/random-layers" "$OUT/five-verifier-layers" \
    --out docs/results/smollm2-v3/verifier_layers.json
