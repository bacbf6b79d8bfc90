"""Prototype: bf16 verifier forwards over few rows without oneDNN (a forward pre-hook), end to end on Spec-Bench
(1 per category) and the demo's prompts: plain and the shipped method, each with default kernels and with the
choice, interleaved per prompt, fastest of 2."""
import json, sys, time, torch
from hf_specdiff.tools.verifiers import load_pair
from hf_specdiff.tools.bench import read_spec_bench, _run_method, _ForwardTimer
from hf_specdiff.tools import demo

ONEDNN_FROM = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.set_num_threads(2)
verifier, tokenizer, drafter = load_pair(dtype=torch.bfloat16)

state = {"on": False, "saved": []}
def pre(module, args, kwargs):
    ids = kwargs.get("input_ids", args[0] if args else None)
    state["saved"].append(torch._C._get_mkldnn_enabled())
    if state["on"]:
        torch._C._set_mkldnn_enabled(ids.shape[1] >= ONEDNN_FROM)
def post(module, args, kwargs, out):
    torch._C._set_mkldnn_enabled(state["saved"].pop())
verifier.register_forward_pre_hook(pre, with_kwargs=True)
verifier.register_forward_hook(post, with_kwargs=True)

prompts = read_spec_bench("../shared/data/spec_bench/question.jsonl", per_category=1)
prompts += [{"category": "demo", "prompt": p} for p in demo.DEMO_PROMPTS]
timers = {id(verifier): _ForwardTimer(verifier), id(drafter): _ForwardTimer(drafter)}
shipped = dict(specdiff=drafter, num_drafts=4, lookup_tokens=10)
methods = {"plain": (dict(), False), "plain, kernels": (dict(), True),
           "shipped": (shipped, False), "shipped, kernels": (shipped, True)}
rows = []
for item in prompts:
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    best = {}
    for rep in range(2):
        for name in list(methods)[:: 1 if rep % 2 == 0 else -1]:
            options, on = methods[name]
            state["on"] = on
            rec = _run_method(verifier, inputs, dict(options), 128, timers)
            if name not in best or rec["seconds"] < best[name]["seconds"]:
                best[name] = rec
    state["on"] = False
    row = {"category": item["category"], **{n: {"tok_s": r["tokens"] / r["seconds"], "tau": r["tokens"] / r["forwards"],
           "exact": r["output"] == best["plain"]["output"]} for n, r in best.items()}}
    rows.append(row); print(json.dumps(row), flush=True)
tot = {n: sum(1 / r[n]["tok_s"] for r in rows) for n in methods}
print("overall vs plain (harmonic, per-token time):", {n: round(tot["plain"] / t, 3) for n, t in tot.items()})
