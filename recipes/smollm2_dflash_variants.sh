#!/usr/bin/env bash
# Issue 16: two choices for the dflash-layout drafter, each against the same baseline (3 layers, random init, reading
# the verifier's layers 1,14,28 = 'auto'), at equal data and steps (ce-streak, features cached): the verifier's own
# first layers copied in (--init-layers 3), and five verifier layers read (1,8,14,21,28, as DFlash reads five).
# Data: the first ROWS rows of the v3 greedy data (recipes/smollm2_data_v2.sh; a snapshot, so later rows do not
# change the split). Then held-out acceptance on one shared sample of windows (experiments/held_out_acceptance.py).
# Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
ROWS=${ROWS:-512}
STEPS=${STEPS:-300}
DATA=$RUN/data_greedy_first$ROWS
OUT=${OUT:-$RUN/dflash_variants}

python - "$RUN/data_greedy" "$DATA" "$ROWS" <<'PY'
import shutil, sys
from pathlib import Path
source, snapshot, rows = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
lines = (source / "data-00000.jsonl").read_text().splitlines()
if not (snapshot / "data-00000.jsonl").exists():
    if len(lines) < rows:
        sys.exit(f"{source} holds {len(lines)} rows, fewer than {rows}: let the data run go on")
    snapshot.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "meta.json", snapshot / "meta.json")
    (snapshot / "data-00000.jsonl").write_text("\n".join(lines[:rows]) + "\n")
PY
COMMON="--verifier smollm2-135m-instruct --data $DATA --objective ce-streak --block-size 16
    --seq-len 192 --batch-size 8 --lr 1e-3 --warmup-steps 50 --max-steps $STEPS --save-every 100 --eval-every 50
    --draft-vocab-size 8192 --precision fp32 --eval-fraction 0.08 --feature-cache true
    --layout dflash --num-hidden-layers 3 --mask-token-id 16"
hf-specdiff train $COMMON --verifier-layers auto --init-layers 0 --out "$OUT/random-layers"
hf-specdiff train $COMMON --verifier-layers auto --init-layers 3 --out "$OUT/verifier-layers"
hf-specdiff train $COMMON --verifier-layers 1,8,14,21,28 --out "$OUT/five-verifier-layers"
python experiments/held_out_acceptance.py "$OUT/random-layers" "$OUT/verifier-layers" \
    --out docs/results/smollm2-v3/init_layers.json
python experiments/held_out_acceptance.py "$OUT/random-layers" "$OUT/five-verifier-layers" \
    --out docs/results/smollm2-v3/verifier_layers.json
