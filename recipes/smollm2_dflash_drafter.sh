#!/usr/bin/env bash
# The SmolLM2 dflash-layout drafter of model_cards/specdiff-dflash-smollm2-135m-instruct, end to end:
#   1. data: recipes/smollm2_data_v2.sh at the sizes the drafter was trained on (708 Magpie + 1,300 builder prompts,
#      the verifier's greedy responses to 1,200 of them: 183k response tokens);
#   2. 1,500 steps at lr 1e-3: recipes/smollm2_dflash_steps.sh (still step-limited at its end);
#   3. CONTINUE more steps from that drafter at lr 5e-4 (a warm restart of the cosine schedule), same data and split.
# Every stage is resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v2}
DATA=${DATA:-$RUN/data_greedy}
CONTINUE=${CONTINUE:-1200}
FIRST=$RUN/drafters/dflash-steps1500
OUT=${OUT:-$RUN/drafters/dflash-steps1500+$CONTINUE}

[ -f "$DATA/meta.json" ] || DTYPE=fp32 MAGPIE=708 BUILDER=1300 SAMPLES=1200 RUN=$RUN bash recipes/smollm2_data_v2.sh
[ -f "$FIRST/model.safetensors" ] || RUN=$RUN DATA=$DATA bash recipes/smollm2_dflash_steps.sh
hf-specdiff train --verifier smollm2-135m-instruct --data "$DATA" --objective ce-streak --verifier-layers auto \
    --block-size 16 --seq-len 192 --batch-size 8 --lr 5e-4 --warmup-steps 20 --max-steps "$CONTINUE" --save-every 100 \
    --eval-every 100 --draft-vocab-size 8192 --precision fp32 --eval-fraction 0.08 --feature-cache true \
    --layout dflash --num-hidden-layers 3 --mask-token-id 16 --init "$FIRST" --out "$OUT"
python experiments/held_out_acceptance.py "$FIRST" "$OUT" --out "docs/results/smollm2-v2/dflash_continued.json"

# 4. the model card folder: the drafter in bf16 (it stores no embeddings or head: 23 MB), its recipe
CARD=model_cards/specdiff-dflash-smollm2-135m-instruct
hf-specdiff package "$OUT" "$CARD" --dtype bf16
# 5. Spec-Bench beside the shipped drafter and prompt lookup, one process: bf16 (2 per category), then fp32
#    (1 per category, with transformers' own DFlash loop, which verifies the whole block every round)
BENCH="hf-specdiff bench --prompts ../shared/data/spec_bench/question.jsonl --max-new-tokens 128 --num-drafts 1,4
    --with-lookup --drafter model_cards/specdiff-smollm2-135m-instruct --compare-drafter $CARD"
$BENCH --per-category 2 --dtype bf16 --method "prompt lookup" --method "SpecDiff-2 conditioned drop-in" \
    --method "SpecDiff-2 conditioned (K=1)" --method "SpecDiff-2 conditioned (K=4) + lookup" \
    --method "SpecDiff-2 dflash drop-in" --method "SpecDiff-2 dflash (K=1)" --method "SpecDiff-2 dflash (K=4) + lookup" \
    --out "$CARD/bench"
$BENCH --per-category 1 --dtype fp32 --method "prompt lookup" --method "SpecDiff-2 conditioned (K=1)" \
    --method "SpecDiff-2 conditioned (K=4) + lookup" --method "SpecDiff-2 dflash drop-in" \
    --method "SpecDiff-2 dflash, transformers' loop" --method "SpecDiff-2 dflash (K=1)" \
    --method "SpecDiff-2 dflash (K=4) + lookup" --out "$CARD/bench-fp32"
# its prompts: Magpie requests the verifier wrote itself, and the builder's, which draw on GSM8K
hf-specdiff card "$CARD" --base-model HuggingFaceTB/SmolLM2-135M-Instruct --dataset openai/gsm8k \
    --bench "$CARD/bench/results.json" \
    --bench "$CARD/bench-fp32/results.json" --reproduce "bash recipes/smollm2_dflash_drafter.sh"
