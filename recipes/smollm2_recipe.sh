#!/usr/bin/env bash
# The recipe of the v2 SmolLM2-135M-Instruct drafter, shipped until v3 (its results and card:
# docs/results/smollm2-v2-shipped; v3: recipes/smollm2_v3.sh): prompts -> verifier samples -> the two SpecDiff-2 drafters
# (standalone and conditioned on the verifier's hidden states) and the baselines (an unaligned mdlm drafter of each
# kind, an AR drafter) -> benchmarks. CPU, 2 threads. Every step is resumable: rerun the script after an interruption.
# Run one step at a time on a 2-core machine: concurrent jobs slow each other down many times over.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2}
SAMPLES=${SAMPLES:-2400}   # samples to draw, shortest prompts first (the slow step: ~1 sample/s here)
mkdir -p "$RUN"

python recipes/make_training_prompts.py --out "$RUN/train_prompts.jsonl" --num 2400
hf-specdiff distill-data --verifier smollm2-135m-instruct --prompts "$RUN/train_prompts.jsonl" --max-samples "$SAMPLES" \
    --out "$RUN/data" --samples-per-prompt 1 --temperature 0.7 --max-new-tokens 160 --batch-size 32

SIZES="--init from-verifier --hidden-size 256 --num-hidden-layers 2 --num-attention-heads 4 --num-key-value-heads 2
    --intermediate-size 768 --block-size 16 --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 100 --precision bf16"
train() { hf-specdiff train --verifier smollm2-135m-instruct --data "$RUN/data" $SIZES "$@"; }
# SpecDiff-2, standalone (v0, 17 min here) and conditioned on verifier layers 1, 14, 28 (the shipped one, 55 min)
train --objective ce-streak --draft-vocab-size 8192 --max-steps 2400 --save-every 400 --eval-every 400 --out "$RUN/drafter"
train --objective ce-streak --draft-vocab-size 8192 --max-steps 1800 --save-every 300 --eval-every 300 \
    --verifier-layers auto --out "$RUN/drafter_cond"
# baselines: unaligned SpecDiff (the mdlm objective; same body, data and steps as each SpecDiff-2 drafter) and an
# autoregressive drafter
train --objective mdlm --draft-vocab-size 8192 --max-steps 2400 --save-every 400 --eval-every 400 --out "$RUN/drafter_mdlm"
train --objective mdlm --draft-vocab-size 8192 --max-steps 1800 --save-every 300 --eval-every 300 \
    --verifier-layers auto --out "$RUN/drafter_cond_mdlm"
train --kind ar --warmup-steps 50 --max-steps 600 --save-every 200 --eval-every 200 --out "$RUN/drafter_ar"

BENCH="hf-specdiff bench --prompts ../shared/data/spec_bench/question.jsonl --drafter $RUN/drafter_cond --num-drafts 1,4
    --with-lookup"
# the headline table: the issue's setting (10 per category, 256 new tokens), the shipped method against prompt lookup
# and against unaligned SpecDiff with the same conditioned body and the same lookup branch (~1.3 h here)
$BENCH --mdlm-drafter $RUN/drafter_cond_mdlm --per-category 10 --max-new-tokens 256 --method "prompt lookup" \
    --method "SpecDiff conditioned (mdlm, K=1) + lookup" --method "SpecDiff-2 conditioned (K=4) + lookup" \
    --out "$RUN/results"
# the alignment taken apart: both conditioned drafters at K=1 and 4, with and without lookup (2 per category,
# 128 new tokens, ~0.5 h)
$BENCH --mdlm-drafter $RUN/drafter_cond_mdlm --per-category 2 --max-new-tokens 128 --out "$RUN/results_alignment"
# the other baselines at the issue's setting: the AR drafter and both standalone diffusion drafters, K=1 (~1.7 h)
OTHERS="--compare-drafter $RUN/drafter --mdlm-drafter $RUN/drafter_mdlm --ar-drafter $RUN/drafter_ar"
$BENCH $OTHERS --per-category 10 --max-new-tokens 256 --method "AR drafter" --method "SpecDiff (mdlm, K=1)" \
    --method "SpecDiff-2 (K=1)" --out "$RUN/results_baselines"
# the ablations: every method (both drafter kinds, K=1 and 4, with and without lookup) on 2 per category, 128 tokens
$BENCH $OTHERS --per-category 2 --max-new-tokens 128 --out "$RUN/results_ablations"
# the model card of that drafter, rendered from the committed results
CARD=$RUN/drafter_cond
KEPT=docs/results/smollm2-v2-shipped
hf-specdiff card $CARD --dataset openai/gsm8k --bench $KEPT/bench/results.json --bench $KEPT/bench-alignment/results.json \
    --bench $KEPT/bench-baselines/results.json --bench $KEPT/bench-ablations/results.json \
    --bench $KEPT/bench-avx2/results.json \
    --reproduce "bash recipes/smollm2_recipe.sh   # data, the five drafters, the four benches and this card"
