#!/usr/bin/env bash
# Drafter v2 data (issue 16): training data in the verifier's own distribution, at scale. Prompts: user requests the
# verifier writes itself (Magpie) plus the builder's kinds (maths, code, extraction, translation, ...); responses:
# the verifier's greedy ones (what greedy decoding meets) and sampled ones. Never Spec-Bench.
# Every step is resumable: rerun the script (or one step) after an interruption. A larger SAMPLES or SAMPLED extends
# the data sets; other MAGPIE/BUILDER sizes make another prompts.jsonl, so give them another RUN folder. Throughput
# and counts: $RUN/magpie.meta.json and $RUN/data_*/stats.json.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v2}
MAGPIE=${MAGPIE:-30000}     # self-synthesised requests to keep
BUILDER=${BUILDER:-6000}    # builder prompts (the kinds the v1 set had)
SAMPLES=${SAMPLES:-36000}   # greedy responses, shortest prompts first
SAMPLED=${SAMPLED:-$SAMPLES} # sampled responses (temperature 0.7), shortest prompts first
DTYPE=${DTYPE:-bf16}        # fp32 on CPUs without AVX512-BF16/AMX, where batched bf16 is many times slower
BATCH=${BATCH:-256}         # responses generated together (prompts are always made 128 at a time)
V=smollm2-135m-instruct
mkdir -p "$RUN"

hf-specdiff synth-prompts --verifier $V --num-prompts "$MAGPIE" --out "$RUN/magpie.jsonl" --batch-size 128 --dtype $DTYPE
python recipes/make_training_prompts.py --out "$RUN/builder.jsonl" --num "$BUILDER" --seed 1
# one fixed interleaving of the two sets (the same file on every rerun with the same sizes)
python - "$RUN" <<'PY'
import json, random, sys
from pathlib import Path
run = Path(sys.argv[1])
rows = [line for name in ("magpie.jsonl", "builder.jsonl") for line in (run / name).read_text().splitlines() if line]
random.Random(0).shuffle(rows)
(run / "prompts.jsonl").write_text("\n".join(rows) + "\n")
PY
# --verifier-layers auto: the hidden states a conditioned drafter reads, kept while generating (the feature cache
# `train --feature-cache true --verifier-layers auto` reads; no teacher forward over the data later)
DISTILL="hf-specdiff distill-data --verifier $V --prompts $RUN/prompts.jsonl --samples-per-prompt 1 --max-new-tokens 256
    --batch-size $BATCH --dtype $DTYPE --verifier-layers auto"
$DISTILL --temperature 0 --max-samples "$SAMPLES" --out "$RUN/data_greedy"
$DISTILL --temperature 0.7 --max-samples "$SAMPLED" --out "$RUN/data_sampled"
