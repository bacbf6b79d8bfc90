"""A/B, interleaved in one process: the shipped method (K=4 + lookup 10) with tree nodes priced as before 384a346
("today" in the records: each prefix at the best rate its rows give it) and coherently (`_ranked_prefixes` from
384a346 on), beside plain, bf16, Spec-Bench N per category x 128 tokens, each method's fastest of R runs (order
reversed every other run). Records to OUT (resumable). Run at 384a346's parent with the coherent function loaded
from a worktree of 384a346; from 384a346 on, the "today" variant is the function below.
    python ab_coherent.py N R OUT.jsonl
DTYPE=fp32 runs it in fp32 (every method writes plain greedy's text), CATEGORY=name on that category's prompts only."""
import json, math, os, sys, time, torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from pathlib import Path
from hf_specdiff import decoding, generate
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_pair


def ranked_prefixes_before(rows, path_scores):
    """`decoding._ranked_prefixes` before 384a346 (as probabilities, which `prune_drafts` takes from the commit
    after it; the run that made the records patched in its log-probability form)."""
    best = {}
    for row, row_scores in zip(rows, path_scores):
        for depth, score in enumerate(row_scores, start=1):
            key = tuple(row[:depth])
            best[key] = min(best.get(key, (float("inf"), depth)), (-score, depth))
    return [(key, math.exp(-neg_score)) for key, (neg_score, _) in sorted(best.items(), key=lambda item: item[1])]


variants = {"today": ranked_prefixes_before, "coherent": decoding._ranked_prefixes}
per_category, repeats, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
torch.set_num_threads(2)
prompts = [p for p in read_spec_bench("/work/shared/data/spec_bench/question.jsonl", per_category)
           if p["category"] == os.environ.get("CATEGORY", p["category"])]
model, tok, drafter = load_pair(dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[os.environ.get("DTYPE", "bf16")])
drafter.cost_profile(model)
forwards = [0]
model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
def run(name, inputs):
    forwards[0] = 0
    start = time.perf_counter()
    if name == "plain":
        o = model.generate(**inputs, max_new_tokens=128, do_sample=False)
    else:
        decoding._ranked_prefixes = variants[name]
        o = generate(model, drafter, **inputs, max_new_tokens=128, do_sample=False, num_drafts=4, lookup_tokens=10)
    return time.perf_counter() - start, o.shape[1] - inputs["input_ids"].shape[1], forwards[0], o[0].tolist()
done = sum(1 for _ in open(out)) if out.exists() else 0
warm = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
for name in ("plain", "today", "coherent"):
    run(name, warm)
for index, item in enumerate(prompts[done:], start=done):
    inputs = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    best = {}
    for r in range(repeats):
        for name in (["plain", "today", "coherent"] if r % 2 == 0 else ["coherent", "today", "plain"]):
            s, n, f, ids = run(name, inputs)
            if name not in best or s < best[name][0]:
                best[name] = (s, n, f)
    rec = {"prompt": index, "category": item["category"], **{k: {"seconds": v[0], "tokens": v[1], "forwards": v[2]} for k, v in best.items()}}
    with open(out, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    p = best["plain"]; t = best["today"]; c = best["coherent"]
    print(index, item["category"], f"today {p[0]/p[1]*t[1]/t[0]:.3f}x tau {t[1]/t[2]:.2f} | coherent {p[0]/p[1]*c[1]/c[0]:.3f}x tau {c[1]/c[2]:.2f}", flush=True)
