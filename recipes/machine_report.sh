#!/usr/bin/env bash
# What the product does on the machine this runs on (issue 42's report), into docs/results/<cpu>-<yyyymmdd>/:
#   lscpu.txt   the CPU and its flags;
#   doctor.txt  `hf-specdiff doctor`: this machine's costs, what the defaults do here and why;
#   demo.txt    README's first command's demo (`hf-specdiff demo`, --dtype auto); progress bars and warnings: stderr.txt;
#   bf16/, fp32/  Spec-Bench 2 per category x 128 new tokens, plain, plain again (the run's noise floor), prompt
#                 lookup, the drop-in path, the drafter alone (K=1) and the shipped method (K=4 + lookup), each prompt
#                 REPEATS times through every method (each method's fastest run kept: other work on a machine only
#                 ever adds time).
# <cpu> is avx2, avx512bf16 or amx by the flags, "imit" added under ATEN_CPU_CAPABILITY (an imitation). Run it
# alone (nothing else on the cores), in the background: about 2 hours at REPEATS=3 on a 2-core EPYC. Resumable:
# each bench keeps its finished prompts; delete a file or folder to measure it again.
#   nohup bash recipes/machine_report.sh > machine_report.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
REPEATS=${REPEATS:-3}
SPEC_BENCH=${SPEC_BENCH:-../shared/data/spec_bench/question.jsonl}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
case "$flags" in
    *amx_bf16*) cpu=amx ;;
    *avx512_bf16*) cpu=avx512bf16 ;;
    *) cpu=avx2 ;;
esac
[ -n "${ATEN_CPU_CAPABILITY:-}" ] && cpu="${ATEN_CPU_CAPABILITY,,}imit"
vendor=$(grep -m1 '^model name' /proc/cpuinfo | grep -qi epyc && echo epyc || echo cpu)
OUT=${OUT:-docs/results/$cpu-$vendor-$(date +%Y%m%d)}
mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
echo "$(git rev-parse --short HEAD) $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')" > "$OUT/commit.txt"
[ -s "$OUT/doctor.txt" ] || hf-specdiff doctor > "$OUT/doctor.txt" 2>> "$OUT/stderr.txt"
[ -s "$OUT/demo.txt" ] || hf-specdiff demo > "$OUT/demo.txt" 2>> "$OUT/stderr.txt"
for dtype in bf16 fp32; do
    hf-specdiff bench --prompts "$SPEC_BENCH" --per-category 2 --max-new-tokens 128 --num-drafts 1,4 --with-lookup \
        --dtype $dtype --repeats "$REPEATS" --method "plain again" --method "prompt lookup" \
        --method "SpecDiff-2 conditioned drop-in" \
        --method "SpecDiff-2 conditioned (K=1)" --method "SpecDiff-2 conditioned (K=4) + lookup" --out "$OUT/$dtype"
done
tail -n 3 "$OUT/demo.txt"
cat "$OUT/bf16/results.md" "$OUT/fp32/results.md"
