"""Per round of the shipped method on one Spec-Bench prompt: tree nodes (lookup / drafter), the probabilities the
tree budget priced them at, the accepted path, the round's seconds against RoundCosts' prediction.
    python tree_rounds.py INDEX [PER_CATEGORY]"""
import math, os, sys, time, torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from hf_specdiff import decoding, generate
from hf_specdiff.decoding import TreeDecoding
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_pair
torch.set_num_threads(2)
item = read_spec_bench("/work/shared/data/spec_bench/question.jsonl", int(sys.argv[2]) if len(sys.argv) > 2 else 2)[int(sys.argv[1])]
model, tok, drafter = load_pair(dtype=torch.bfloat16)
inputs = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
log = []
budget = decoding.tree_budget
def logged_budget(probs, costs, max_nodes):
    n = budget(probs, costs, max_nodes)
    log.append(dict(probs=[round(p, 2) for p in probs[:8]], n=n, pred=[round(1000 * float(c), 1) for c in costs.predict(torch.arange(0, 6).float())]))
    return n
decoding.tree_budget = logged_budget
learn_costs = TreeDecoding.learn_costs
rounds = []
def logged_learn_costs(self, round_, seconds):
    rounds.append(dict(nodes=len(round_.tree), lookups=[len(r) for r in round_.lookups], drafts=[len(r) for r in round_.drafts],
                       ms=round(1000 * seconds, 1), pred=round(1000 * float(self.round_costs.predict(torch.tensor([float(len(round_.tree))]))[0]), 1),
                       slowdown=round(self.round_costs.slowdown, 2), budget=log[-1] if log else None))
    log.clear()
    return learn_costs(self, round_, seconds)
TreeDecoding.learn_costs = logged_learn_costs
accept = TreeDecoding.accept
def logged_accept(self, round_, target_scores):
    path, nxt = accept(self, round_, target_scores)
    self._last_path = len(path)
    return path, nxt
TreeDecoding.accept = logged_accept
learn = TreeDecoding.learn
def logged_learn(self, round_, path, next_token):
    learn(self, round_, path, next_token)
    if rounds: rounds[-1]["accepted"] = len(path)
TreeDecoding.learn = logged_learn
for run in range(2):
    rounds.clear()
    t = time.perf_counter()
    out = generate(model, drafter, **inputs, max_new_tokens=128, do_sample=False, num_drafts=4, lookup_tokens=10)
    print("run", run, item["category"], f"{time.perf_counter() - t:.2f}s", out.shape[1] - inputs["input_ids"].shape[1], "tokens", len(rounds), "rounds")
for r in rounds:
    if r["nodes"]:
        print(r)
print("plain rounds", sum(1 for r in rounds if not r["nodes"]), "mean ms", sum(r["ms"] for r in rounds if not r["nodes"]) / max(1, sum(1 for r in rounds if not r["nodes"])))
