# fp32 tau with a fixed 15-node tree (no wall-clock in the pruning): main at e6cf257 (one set of lookup rates per
# rank), and branch lookup-rates-by-ngram at 51ea177 (rates per rank and matched n-gram length) with n <= 3 and n <= 4.
# Run from the repository root after: git worktree add /tmp/old e6cf257 && git worktree add /tmp/ngram 51ea177
OUT=$PWD/docs/results/smollm2-v3/lookup-rates-by-ngram
C=qa,translation,rag,extraction,summarization,coding,writing
P=/work/shared/data/spec_bench/question.jsonl
run() {  # dir, max_ngram or "", out
  (cd $1 && PYTHONPATH=$1 python - "$2" "$3" <<'PY'
import runpy, sys
import hf_specdiff.decoding as d
if sys.argv[1]:
    d.LOOKUP_MAX_NGRAM = int(sys.argv[1])
d.TreeDecoding._tree_budget = lambda self: (None, 15)
out = sys.argv[2]
sys.argv = ["tree_tau.py", "--prompts", "/work/shared/data/spec_bench/question.jsonl", "--categories",
            "qa,translation,rag,extraction,summarization,coding,writing", "--per-category", "2", "--fp32",
            "--configs", "shipped,lookup-tree", "--out", out]
runpy.run_path("experiments/tree_tau.py", run_name="__main__")
PY
  ) > /dev/null 2>&1
}
run /tmp/old "" $OUT/tree-tau-fp32-fixed15-old.json
run /tmp/ngram 4 $OUT/tree-tau-fp32-fixed15-new4.json
run /tmp/ngram 3 $OUT/tree-tau-fp32-fixed15-new3.json
