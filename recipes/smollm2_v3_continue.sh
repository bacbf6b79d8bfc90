#!/usr/bin/env bash
# More steps for the v3 drafter that won the ablation (specdiff 2x256 on all rows, docs/results/smollm2-v3/
# bench-ablations): its learning curve still rose at 2,000 steps (one pass over the 3M-token data), so CONTINUE more
# steps from it at lr 5e-4 (a warm restart of the cosine schedule), same data, split and settings, bf16 autocast
# (PRECISION=fp32 on AVX2-only CPUs, into another OUT). Resumable: rerun after an interruption. FIRST=<a continued
# drafter> trains that one further (OUT defaults to FIRST+CONTINUE). DATA=<folders> trains on other data folders
# (say the v3 data and recipes/smollm2_translate_data.sh's); both drafters are then compared on the held-out rows
# of the v3 data and, where DATA has them, of the translation data.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
CONTINUE=${CONTINUE:-6000}
PRECISION=${PRECISION:-bf16}
LR=${LR:-5e-4}
FIRST=${FIRST:-$RUN/drafters/specdiff-rows0}   # the drafter to train further
OUT=${OUT:-$FIRST+$CONTINUE}
DATA=${DATA:-$RUN/data_greedy,$RUN/data_sampled}
hf-specdiff train --verifier smollm2-135m-instruct --data "$DATA" --objective ce-streak \
    --verifier-layers auto --block-size 16 --seq-len 192 --batch-size 8 --lr $LR --warmup-steps 20 \
    --max-steps "$CONTINUE" --save-every 100 --eval-every 250 --draft-vocab-size 8192 --precision "$PRECISION" \
    --eval-fraction 0.08 --feature-cache true --layout specdiff --hidden-size 256 --num-hidden-layers 2 \
    --num-attention-heads 4 --num-key-value-heads 2 --intermediate-size 768 --init "$FIRST" --out "$OUT"
RESULT="docs/results/smollm2-v3/continued-$(basename "$OUT")"
python experiments/held_out_acceptance.py "$FIRST" "$OUT" --data "$RUN/data_greedy,$RUN/data_sampled" --out "$RESULT.json"
if [[ "$DATA" == *data_translate_greedy* ]]; then
    python experiments/held_out_acceptance.py "$FIRST" "$OUT" --data "$RUN/data_translate_greedy" \
        --out "$RESULT-translation.json"
fi
