#!/usr/bin/env bash
# Drafter v3 (issue 16) from nothing to learning curves, in one resumable command: the 3M-token data (10,000 greedy
# and 6,000 sampled responses of SmolLM2-135M-Instruct to 6,000 self-written and 4,000 builder prompts), then the
# learning curves of two drafter kinds at two data sizes (recipes/smollm2_drafters_v2.sh), held-out acceptance
# included. Rerun it after any interruption: finished steps are skipped, a lost work tree restarts from the rows
# kept in datasets/smollm2-v3 (recipes/data_snapshot.py), and the rows made are kept there again before training.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
SNAPSHOT=datasets/smollm2-v3
[ -d "$SNAPSHOT" ] && python recipes/data_snapshot.py restore "$SNAPSHOT" "$RUN"
# bf16: 1,050 tok/s on the 2-core AVX512-BF16/AMX machine against 400 in fp32 (batch 256); a data folder keeps the
# dtype it was started with (distill-data refuses to mix), so finish it on such a machine
RUN=$RUN DTYPE=bf16 MAGPIE=6000 BUILDER=4000 SAMPLES=10000 SAMPLED=6000 bash recipes/smollm2_data_v2.sh
python recipes/data_snapshot.py save "$RUN" "$SNAPSHOT"
# bf16 autocast: on the AVX512-BF16/AMX machine 6x faster than fp32 (a dflash step 0.37 s, a specdiff one 0.22 s)
RUN=$RUN DATA=$RUN/data_greedy,$RUN/data_sampled STEPS=2000 SMALL=2000 RESULTS=docs/results/smollm2-v3 BENCH=0 \
    PRECISION=bf16 bash recipes/smollm2_drafters_v2.sh
