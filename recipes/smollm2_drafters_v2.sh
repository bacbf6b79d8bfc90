#!/usr/bin/env bash
# Drafter v2 (issue 16): learning curves of two drafter kinds at two data sizes, equal steps, on the v2 data
# (recipes/smollm2_data_v2.sh). Kinds: today's conditioned SpecDiff drafter (2 layers at width 256, own
# embeddings and a PCA-projected 8k head) and the dflash layout (3 layers at the verifier's width 576, its
# embeddings and head). The verifier's features are computed once per data set (kept in the data folder, --feature-cache:
# the online teacher forward would cost 3x the steps here).
# Every run is resumable: rerun the script after an interruption. CPU, 2 threads. PRECISION: fp32 (default) on
# AVX2-only machines, where batched bf16 is many times slower; bf16 (autocast) on AVX512-BF16/AMX ones, where it is
# several times faster (a dflash step 0.37 s against ~2.7 s in fp32, a specdiff one 0.22 s against 1.4 s).
# The 3M-token v3 data (greedy and sampled responses, both folders train together), one pass: recipes/smollm2_v3.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v2}
DATA=${DATA:-$RUN/data_greedy}  # one data folder, or several separated by commas
STEPS=${STEPS:-600}
SMALL=${SMALL:-250}           # training rows of the smaller data size, a fixed random draw (0: all)
OUT=${OUT:-$RUN/drafters}
RESULTS=${RESULTS:-docs/results/smollm2-v2}
BENCH=${BENCH:-1}             # 0: no Spec-Bench run at the end
PRECISION=${PRECISION:-fp32}  # a run resumes in the precision it started with

COMMON="--verifier smollm2-135m-instruct --data $DATA --objective ce-streak --verifier-layers auto --block-size 16
    --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 50 --max-steps $STEPS --save-every 100 --eval-every 50
    --draft-vocab-size 8192 --precision $PRECISION --eval-fraction 0.08 --feature-cache true"
SPECDIFF="--layout specdiff --hidden-size 256 --num-hidden-layers 2 --num-attention-heads 4 --num-key-value-heads 2
    --intermediate-size 768"
DFLASH="--layout dflash --num-hidden-layers 3 --mask-token-id 16"   # 16 = <empty_output>, unused in chat
for rows in 0 "$SMALL"; do   # all rows first: the candidates to ship
    hf-specdiff train $COMMON $SPECDIFF --max-train-rows "$rows" --out "$OUT/specdiff-rows$rows"
    hf-specdiff train $COMMON $DFLASH --max-train-rows "$rows" --out "$OUT/dflash-rows$rows"
done
python experiments/learning_curves.py "$OUT"/specdiff-rows* "$OUT"/dflash-rows* --out "$RESULTS"
python experiments/held_out_acceptance.py "$OUT"/specdiff-rows* "$OUT"/dflash-rows* --out "$RESULTS/held_out.json"
[ "$BENCH" = 1 ] || exit 0
# the dflash drafter trained on all rows, against plain decoding and prompt lookup (1 per category, 128 new tokens)
hf-specdiff bench --prompts ../shared/data/spec_bench/question.jsonl --per-category 1 --max-new-tokens 128 \
    --drafter "$OUT/dflash-rows0" --num-drafts 1,4 --with-lookup --method "prompt lookup" \
    --method "SpecDiff-2 dflash (K=1)" --method "SpecDiff-2 dflash, transformers' loop" \
    --method "SpecDiff-2 dflash (K=4) + lookup" --out "$RESULTS/bench"
