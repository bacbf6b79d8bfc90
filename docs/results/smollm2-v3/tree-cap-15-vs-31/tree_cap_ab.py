"""bf16 A/B of the greedy tree's node cap (DEFAULT_MAX_TREE_NODES 15 vs 31, each sized by its own measured round
costs: one drafter per arm), K=4 + lookup, against plain, on Spec-Bench; methods interleaved, order rotated."""
import json, sys, time, torch, hf_specdiff
import hf_specdiff.decoding as decoding
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier
torch.set_num_threads(2)
per_cat, new_tokens, caps = int(sys.argv[1]), int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")]
verifier, tok = load_verifier("smollm2-135m-instruct", dtype=torch.bfloat16)
drafters = {cap: SpecDiffDrafter.from_pretrained(shipped_drafter_path(), dtype=torch.bfloat16).eval() for cap in caps}
methods = ["plain"] + [f"cap {c}" for c in caps]
tot = {}
for i, item in enumerate(read_spec_bench("../shared/data/spec_bench/question.jsonl", per_cat)):
    x = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True,
                                return_tensors="pt", return_dict=True)
    order = methods[i % len(methods):] + methods[:i % len(methods)]
    for m in order:
        stats = hf_specdiff.SpecDiffStats()
        t = time.perf_counter()
        if m == "plain":
            out = verifier.generate(**x, max_new_tokens=new_tokens, do_sample=False); fw = out.shape[1] - x["input_ids"].shape[1]
        else:
            cap = int(m.split()[1]); decoding.DEFAULT_MAX_TREE_NODES = cap
            out = hf_specdiff.generate(verifier, drafters[cap], **x, max_new_tokens=new_tokens, do_sample=False,
                                       num_drafts=4, lookup_tokens=10, stats=stats); fw = stats.rounds
        s = time.perf_counter() - t; n = out.shape[1] - x["input_ids"].shape[1]
        for k in (item["category"], "overall"):
            a = tot.setdefault(k, {}).setdefault(m, [0, 0.0, 0]); a[0] += n; a[1] += s; a[2] += fw
    print(item["category"], {m: f"{tot[item['category']][m][0] / tot[item['category']][m][1]:.1f}" for m in methods}, flush=True)
res = {k: {m: {"tok_s": n / s, "speedup": (n / s) / (v["plain"][0] / v["plain"][1]), "tau": n / f} for m, (n, s, f) in v.items()} for k, v in tot.items()}
import os; os.makedirs("runs/ab", exist_ok=True)
json.dump({"argv": sys.argv, "results": res}, open(f"runs/ab/tree_cap_{per_cat}x{new_tokens}.json", "w"), indent=1)
for k, v in res.items():
    print(f"{k:14s}", "  ".join(f"{m}: {r['speedup']:.2f}x tau {r['tau']:.2f}" for m, r in v.items()))
