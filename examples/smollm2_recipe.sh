#!/usr/bin/env bash
# The recipe of the shipped SmolLM2-135M-Instruct drafter: prompts -> verifier samples -> training -> benchmark -> card.
# CPU, 2 threads. Every step is resumable: rerun the script after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2}
SAMPLES=${SAMPLES:-2400}   # samples to draw, shortest prompts first (the slow step: ~1 sample/s here)
STEPS=${STEPS:-2400}
mkdir -p "$RUN"

python examples/make_training_prompts.py --out "$RUN/train_prompts.jsonl" --num 2400
hf-specdiff distill-data --verifier smollm2-135m-instruct --prompts "$RUN/train_prompts.jsonl" --max-samples "$SAMPLES" \
    --out "$RUN/data" --samples-per-prompt 1 --temperature 0.7 --max-new-tokens 160 --batch-size 32
hf-specdiff train --verifier smollm2-135m-instruct --data "$RUN/data" --out "$RUN/drafter" \
    --objective ce-streak --init from-verifier --hidden-size 256 --num-hidden-layers 2 --num-attention-heads 4 \
    --num-key-value-heads 2 --intermediate-size 768 --draft-vocab-size 8192 --block-size 16 --seq-len 192 \
    --batch-size 8 --lr 1e-3 --warmup-steps 100 --max-steps "$STEPS" --save-every 250 --eval-every 250 \
    --precision bf16
hf-specdiff bench --prompts ../shared/data/spec_bench/question.jsonl --per-category "${PER_CATEGORY:-4}" \
    --max-new-tokens "${MAX_NEW_TOKENS:-128}" --drafter "$RUN/drafter" --num-drafts 1,4 --out "$RUN/results"
