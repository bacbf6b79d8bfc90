"""bf16 verifier forward over k rows, with torch.backends.mkldnn on and off (per call), interleaved."""
import sys, time, torch
from transformers import DynamicCache
from hf_specdiff.tools.verifiers import load_verifier
torch.set_num_threads(2)
model, tok = load_verifier("smollm2-135m-instruct", dtype=getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16"))
print(torch.__version__, torch.backends.cpu.get_cpu_capability())
ctx = torch.randint(100, 20000, (1, 128))
with torch.no_grad():
    cache = DynamicCache(); model(ctx, past_key_values=cache, use_cache=True)
    def fwd(k):
        ids = torch.randint(100, 20000, (1, k))
        t = time.perf_counter(); model(ids, past_key_values=cache, use_cache=True); dt = time.perf_counter() - t
        cache.crop(-k); return dt
    res = {}
    for rep in range(7):
        for k in (1, 2, 4, 8, 16):
            for on in (True, False):
                with torch.backends.mkldnn.flags(enabled=on):
                    res.setdefault((k, on), []).append(fwd(k))
    for k in (1, 2, 4, 8, 16):
        print(k, " ".join(f"mkldnn={on}: {min(res[(k,on)])*1e3:6.1f} ms" for on in (True, False)))
