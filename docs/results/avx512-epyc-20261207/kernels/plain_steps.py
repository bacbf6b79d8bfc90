import sys, time, torch
from hf_specdiff.tools.verifiers import load_pair
from hf_specdiff.tools import demo
torch.set_num_threads(2)
verifier, tokenizer, drafter = load_pair(dtype=torch.bfloat16)
profile = drafter.cost_profile(verifier)
inputs = tokenizer.apply_chat_template([{"role": "user", "content": demo.DEMO_PROMPTS[3]}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
times, t0 = [], [0.0]
verifier.register_forward_pre_hook(lambda *a: t0.__setitem__(0, time.perf_counter()))
verifier.register_forward_hook(lambda *a: times.append(1000 * (time.perf_counter() - t0[0])))
for mode in ("kernels", "kernels", "default"):
    times.clear()
    with profile.verifier_kernels(verifier) if mode == "kernels" else torch.no_grad():
        verifier.generate(**inputs, max_new_tokens=48, do_sample=False)
    print(mode, " ".join(f"{t:.0f}" for t in times))
