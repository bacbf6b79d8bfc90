#!/usr/bin/env bash
# Ship the v3 drafter (issue 16) as the default one, model_cards/specdiff-smollm2-135m-instruct, after
# recipes/smollm2_v3.sh (data, learning curves), the ablation that picked the kind (docs/results/smollm2-v3/
# bench-ablations: specdiff 2x256 over dflash 3x576) and recipes/smollm2_v3_continue.sh (more steps for it):
#   1. the drafter shipped so far is kept aside (runs/.../shipped-v2), the winner goes into the card folder in bf16
#      with its recipe;
#   2. recipes/bench_card.sh: its benchmarks (the 2-per-category ablation, the headline at the card's setting) and
#      the card rendered from them. `python experiments/compare_drafters.py $CARD $BEFORE` sets the new drafter
#      beside the one it replaced.
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
bash recipes/bench_card.sh
