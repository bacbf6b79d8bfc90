"""What the K=4 + lookup tree does, round by round, for one or more drafters on the same Spec-Bench prompts: which
branch (drafter or prompt lookup) the accepted path followed, how well each node's score (the probability of
acceptance the tree ranks nodes by) predicts its acceptance, by branch and depth, and how many nodes the budget
verified (how often the cap, `DEFAULT_MAX_TREE_NODES`, bound it). `--fp32` makes every drafter's
text plain greedy's, so their tau compare on the same text (in bf16 the texts diverge between runs).

    python experiments/trace_tree_rounds.py DRAFTER [DRAFTER ...] --out trace.json [--fp32] [--per-category 2]
"""

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import hf_specdiff
from hf_specdiff import decoding
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_verifier


class RoundRecorder:
    """Wraps `TreeDecoding._prune` (to see every candidate node and its score), `learn` (to see what was
    accepted) and `tree_budget` (to see each round's size); `nodes` collects (drafter, category, branch, depth,
    conditional score, accepted) of reached nodes, `budgets` (drafter, nodes verified, candidates, cap)."""

    def __init__(self):
        self.nodes, self.budgets, self.context = [], [], {}
        self.prune, self.learn = decoding.TreeDecoding._prune, decoding.TreeDecoding.learn
        recorder, tree_budget = self, decoding.tree_budget

        def prune(tree_decoding, lookup, draft_scores):
            rows, scores = tree_decoding.candidates(lookup, draft_scores)
            branches = ["lookup"] * len(lookup) + ["drafter"] * (len(rows) - len(lookup))
            recorder.candidates = list(zip(branches, rows, scores))
            return recorder.prune(tree_decoding, lookup, draft_scores)

        def budget(probs, costs, max_nodes):
            n = tree_budget(probs, costs, max_nodes)
            recorder.budgets.append({"drafter": recorder.context["drafter"], "nodes": n, "candidates": len(probs),
                                     "cap": max_nodes})
            return n

        def learn(tree_decoding, round_, path, next_token):
            recorder.record([int(round_.tree.tokens[n]) for n in path])
            return recorder.learn(tree_decoding, round_, path, next_token)

        decoding.TreeDecoding._prune, decoding.TreeDecoding.learn, decoding.tree_budget = prune, learn, budget

    def record(self, accepted: list[int]):
        seen = set()
        for branch, row, scores in self.candidates:
            for depth in range(1, len(row) + 1):
                if (branch, tuple(row[:depth])) in seen or accepted[:depth - 1] != row[:depth - 1]:
                    continue  # counted already, or not reached (its parent was rejected)
                seen.add((branch, tuple(row[:depth])))
                score = math.exp(scores[depth - 1] - (scores[depth - 2] if depth > 1 else 0.0))
                self.nodes.append({**self.context, "branch": branch, "depth": depth, "score": score,
                                   "accepted": accepted[:depth] == row[:depth]})


def calibration(nodes: list[dict]) -> dict:
    """Per branch and depth (1-3), per score fifth: nodes, mean score, acceptance rate."""
    table = defaultdict(lambda: [0, 0.0, 0])
    for node in nodes:
        if node["depth"] <= 3:
            key = f"{node['branch']} depth {node['depth']} score {min(int(node['score'] * 5), 4) / 5:.1f}+"
            table[key][0] += 1
            table[key][1] += node["score"]
            table[key][2] += node["accepted"]
    return {key: {"nodes": n, "mean_score": s / n, "accepted": a / n} for key, (n, s, a) in sorted(table.items())}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="+")
    parser.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    verifier, tokenizer = load_verifier("smollm2-135m-instruct", dtype=dtype)
    drafters = {path: AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=True).eval()
                for path in args.drafters}
    recorder = RoundRecorder()
    runs = []
    for index, item in enumerate(read_spec_bench(args.prompts, args.per_category)):
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
        for path, drafter in drafters.items():
            recorder.context = {"drafter": path, "category": item["category"]}
            stats = hf_specdiff.SpecDiffStats()
            start = time.perf_counter()
            out = hf_specdiff.generate(verifier, drafter, **inputs, num_drafts=4, lookup_tokens=10, do_sample=False,
                                       max_new_tokens=args.max_new_tokens, stats=stats)
            runs.append({"drafter": path, "prompt": index, "category": item["category"], "tau": stats.tau,
                         "seconds": time.perf_counter() - start, "tokens": stats.new_tokens,
                         "output": out[0, inputs["input_ids"].shape[1]:].tolist()})
            print(index, item["category"], path, f"tau {stats.tau:.2f}", flush=True)
    summary = {}
    for path in args.drafters:
        mine = [r for r in runs if r["drafter"] == path]
        nodes = [n for n in recorder.nodes if n["drafter"] == path]
        first = defaultdict(list)
        for node in nodes:
            if node["branch"] == "drafter" and node["depth"] == 1:
                first[node["category"]].append(node["accepted"])
        budgets = [b for b in recorder.budgets if b["drafter"] == path]
        summary[path] = {
            "tau": sum(r["tokens"] for r in mine) / sum(r["tokens"] / r["tau"] for r in mine),
            "mean_nodes": sum(b["nodes"] for b in budgets) / len(budgets),
            "rounds_at_cap": sum(b["nodes"] == b["cap"] for b in budgets) / len(budgets),
            "rounds_with_more_candidates_than_cap": sum(b["candidates"] > b["cap"] for b in budgets) / len(budgets),
            "drafter_first_token_nodes_accepted": {c: sum(v) / len(v) for c, v in first.items()},
            "calibration": calibration(nodes)}
    same_text = all(len({tuple(r["output"]) for r in runs if r["prompt"] == i}) == 1
                    for i in {r["prompt"] for r in runs})
    Path(args.out).write_text(json.dumps({"settings": vars(args), "same_text_for_every_drafter": same_text,
                                          "summary": summary, "runs": runs}, indent=1))
    print(json.dumps({p: s["tau"] for p, s in summary.items()}, indent=1), "same text:", same_text)


if __name__ == "__main__":
    main()
