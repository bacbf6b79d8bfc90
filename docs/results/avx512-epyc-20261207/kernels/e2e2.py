"""The shipped method with the kernel choice in its profile against plain generate as torch runs it and plain generate
under the same kernel choice (Spec-Bench 1 per category + the demo's prompts, bf16, 128 tokens, fastest of 2,
interleaved)."""
import json, sys, torch
from hf_specdiff.tools.verifiers import load_pair
from hf_specdiff.tools.bench import read_spec_bench, _run_method, _ForwardTimer
from hf_specdiff.tools import demo

torch.set_num_threads(2)
verifier, tokenizer, drafter = load_pair(dtype=getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16"))
profile = drafter.cost_profile(verifier)
print("onednn_from", profile.onednn_from, flush=True)
prompts = read_spec_bench("../shared/data/spec_bench/question.jsonl", per_category=1)
prompts += [{"category": "demo", "prompt": p} for p in demo.DEMO_PROMPTS]
timers = {id(verifier): _ForwardTimer(verifier), id(drafter): _ForwardTimer(drafter)}
shipped = dict(specdiff=drafter, num_drafts=4, lookup_tokens=10)
methods = {"plain": (dict(), False), "plain, kernels": (dict(), True), "shipped": (shipped, False)}
rows = []
for item in prompts:
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    best = {}
    for rep in range(2):
        for name in list(methods)[:: 1 if rep % 2 == 0 else -1]:
            options, kernels = methods[name]
            with profile.verifier_kernels(verifier) if kernels else torch.no_grad():
                rec = _run_method(verifier, inputs, dict(options), 128, timers)
            if name not in best or rec["seconds"] < best[name]["seconds"]:
                best[name] = rec
    row = {"category": item["category"], **{n: {"tok_s": r["tokens"] / r["seconds"], "tau": r["tokens"] / r["forwards"],
           "exact": r["output"] == best["plain"]["output"], "exact_k": r["output"] == best["plain, kernels"]["output"]}
           for n, r in best.items()}}
    rows.append(row); print(json.dumps(row), flush=True)
tot = {n: sum(1 / r[n]["tok_s"] for r in rows) for n in methods}
print("overall vs plain (per-token time):", {n: round(tot["plain"] / t, 3) for n, t in tot.items()})
print("shipped vs plain, kernels:", round(tot["plain, kernels"] / tot["shipped"], 3))
