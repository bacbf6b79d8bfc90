#!/usr/bin/env bash
# Benchmark the shipped drafter (model_cards/specdiff-smollm2-135m-instruct) and render its card from the results:
#   1. bench-ablations/: Spec-Bench 2 per category, 128 new tokens: the drafter alone (K=1, K=4), through
#      transformers' loop (drop-in) and as the shipped method (K=4 + lookup), beside prompt lookup;
#   2. bench/: the headline at the card's setting (10 per category, 256 new tokens): the shipped method against plain
#      and prompt lookup;
#   3. bench-sampling/: as 1, sampling at temperature 0.7, top-p 0.9 (every method of a prompt from the same seed);
#   4. bench-fp32/: 3 per category, 256 new tokens, in fp32, where every method writes plain greedy's text: the
#      shipped method against plain and prompt lookup on the same tokens;
#   5. the card rendered from the four.
# bf16 (but 4), 2 threads, one process per bench, methods interleaved per prompt. Resumable: every bench keeps each
# finished prompt (delete a folder to measure it again). About 20 + 30 + 20 + 15 minutes on the 2-core EPYC.
set -euo pipefail
cd "$(dirname "$0")/.."
CARD=${CARD:-model_cards/specdiff-smollm2-135m-instruct}
SPEC_BENCH=../shared/data/spec_bench/question.jsonl
hf-specdiff bench --prompts $SPEC_BENCH --per-category 2 --max-new-tokens 128 --drafter $CARD --num-drafts 1,4 \
    --with-lookup --method "prompt lookup" --method "SpecDiff-2 conditioned drop-in" \
    --method "SpecDiff-2 conditioned (K=1)" --method "SpecDiff-2 conditioned (K=4)" \
    --method "SpecDiff-2 conditioned (K=4) + lookup" --out $CARD/bench-ablations
hf-specdiff bench --prompts $SPEC_BENCH --per-category 10 --max-new-tokens 256 --drafter $CARD --num-drafts 4 \
    --with-lookup --method "prompt lookup" --method "SpecDiff-2 conditioned (K=4) + lookup" --out $CARD/bench
hf-specdiff bench --prompts $SPEC_BENCH --per-category 2 --max-new-tokens 128 --drafter $CARD --num-drafts 1,4 \
    --with-lookup --method "prompt lookup" --method "SpecDiff-2 conditioned drop-in" \
    --method "SpecDiff-2 conditioned (K=1)" --method "SpecDiff-2 conditioned (K=4)" \
    --method "SpecDiff-2 conditioned (K=4) + lookup" --temperature 0.7 --top-p 0.9 --out $CARD/bench-sampling
hf-specdiff bench --prompts $SPEC_BENCH --per-category 3 --max-new-tokens 256 --drafter $CARD --num-drafts 4 \
    --with-lookup --method "prompt lookup" --method "SpecDiff-2 conditioned (K=4) + lookup" --dtype fp32 \
    --out $CARD/bench-fp32
# its prompts: Magpie requests the verifier wrote itself, and the builder's, which draw on GSM8K
hf-specdiff card $CARD --base-model HuggingFaceTB/SmolLM2-135M-Instruct --dataset openai/gsm8k \
    --bench $CARD/bench/results.json --bench $CARD/bench-ablations/results.json \
    --bench $CARD/bench-sampling/results.json --bench $CARD/bench-fp32/results.json \
    --reproduce "bash recipes/smollm2_v3.sh && bash recipes/smollm2_v3_continue.sh && bash recipes/smollm2_ship_v3.sh"
