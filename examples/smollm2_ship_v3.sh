#!/usr/bin/env bash
# Ship the v3 drafter (issue 16) as the default one, model_cards/specdiff-smollm2-135m-instruct, after
# examples/smollm2_v3.sh (data, learning curves), the ablation that picked the kind (docs/results/smollm2-v3/
# bench-ablations: specdiff 2x256 over dflash 3x576) and examples/smollm2_v3_continue.sh (more steps for it):
#   1. the drafter shipped so far is kept aside (runs/.../shipped-v2), the winner goes into the card folder in bf16
#      with its recipe;
#   2. bench-ablations/: Spec-Bench 2 per category, 128 new tokens, the new drafter at every path (drop-in, K=1,
#      K=4, K=4 + lookup) beside the one it replaces (K=1, K=4 + lookup) and prompt lookup, one process;
#   3. bench/: the headline at the card's setting (10 per category, 256 new tokens): the shipped method (K=4 +
#      lookup) against plain and prompt lookup;
#   4. the card rendered from them.
# bf16, 2 threads, interleaved per prompt. Resumable: both benches keep each finished prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
WINNER=${WINNER:-$RUN/drafters/specdiff-rows0+6000}
CARD=model_cards/specdiff-smollm2-135m-instruct
BEFORE=${BEFORE:-$RUN/drafters/shipped-v2}  # where the card's drafter is kept aside (the next ship: another folder)
if ! cmp -s "$WINNER/training_recipe.json" $CARD/training_recipe.json; then
    [ -f $BEFORE/model.safetensors ] || (mkdir -p $BEFORE && cp $CARD/*.json $CARD/*.py $CARD/model.safetensors $BEFORE/)
    rm -rf $CARD/bench*
    hf-specdiff package "$WINNER" $CARD --dtype bf16
fi
python examples/compare_drafters.py $CARD $BEFORE --per-category 2 --max-new-tokens 128 --out $CARD/bench-ablations
hf-specdiff bench --prompts ../shared/data/spec_bench/question.jsonl --per-category 10 --max-new-tokens 256 \
    --drafter $CARD --num-drafts 4 --with-lookup --method "prompt lookup" \
    --method "SpecDiff-2 conditioned (K=4) + lookup" --out $CARD/bench
# its prompts: Magpie requests the verifier wrote itself, and the builder's, which draw on GSM8K
hf-specdiff card $CARD --base-model HuggingFaceTB/SmolLM2-135M-Instruct --dataset openai/gsm8k \
    --bench $CARD/bench/results.json --bench $CARD/bench-ablations/results.json \
    --reproduce "bash examples/smollm2_v3.sh && bash examples/smollm2_v3_continue.sh && bash examples/smollm2_ship_v3.sh"
