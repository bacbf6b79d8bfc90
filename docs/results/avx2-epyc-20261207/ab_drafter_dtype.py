"""A/B at equal prompts, interleaved in one process: our paths with the shipped drafter in bf16 (as today) and in
fp32, beside a bf16 verifier. Spec-Bench N per category x 128 tokens, each method's fastest of R runs.
    python ab_drafter_dtype.py N R OUT.jsonl"""
import json, os, sys, torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from pathlib import Path
from transformers import AutoModelForCausalLM
from hf_specdiff.tools.bench import _run_prompt, _ForwardTimer, read_spec_bench
from hf_specdiff.tools.verifiers import load_verifier
from hf_specdiff.tools.shipped import shipped_drafter_path
per_category, repeats, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
torch.set_num_threads(2)
prompts = read_spec_bench("/work/shared/data/spec_bench/question.jsonl", per_category)
verifier, tokenizer = load_verifier(dtype=torch.bfloat16)
path = shipped_drafter_path("smollm2-135m-instruct")
d = {name: AutoModelForCausalLM.from_pretrained(path, dtype=dt, trust_remote_code=True).eval()
     for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
for name, drafter in d.items():
    p = drafter.cost_profile(verifier)  # measured (or read) before any timed call
    print(name, "drafter ms", {g: round(1000 * s, 1) for g, s in p.drafter.items()}, "plain", round(1000 * p.plain_step, 1), flush=True)
methods = {"plain": {}}
for name, drafter in d.items():
    methods[f"drop-in {name}"] = dict(assistant_model=drafter, attach=True)
    methods[f"K=1 {name}"] = dict(specdiff=drafter, num_drafts=1)
    methods[f"K=4+lookup {name}"] = dict(specdiff=drafter, num_drafts=4, lookup_tokens=10)
timers = {id(m): _ForwardTimer(m) for m in (verifier, *d.values())}
done = sum(1 for _ in open(out)) if out.exists() else 0
for index, item in enumerate(prompts[done:], start=done):
    records = _run_prompt(verifier, tokenizer, item, methods, 128, timers, repeats)
    with open(out, "a") as f:
        f.write(json.dumps({"prompt": index, "records": records}) + "\n")
    print(index, item["category"], " ".join(f"{r['method']} {r['seconds']:.2f}s/{r['forwards']}" for r in records), flush=True)
