import os, sys, time, torch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from hf_specdiff.tools.bench import read_spec_bench
from hf_specdiff.tools.verifiers import load_verifier
torch.set_num_threads(2)
item = read_spec_bench("/work/shared/data/spec_bench/question.jsonl", 2)[int(sys.argv[1])]
model, tok = load_verifier(dtype=torch.bfloat16)
inputs = tok.apply_chat_template([{"role": "user", "content": item["prompt"]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
print("prompt tokens", inputs["input_ids"].shape[1])
for n in (1, 128, 1, 128):
    t = time.perf_counter(); model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False); print(n, f"{time.perf_counter()-t:.3f}s")
