import copy, time, contextlib, torch, torch.nn.functional as F
from transformers import DynamicCache
from hf_specdiff.tools.verifiers import DEFAULT_VERIFIER, load_verifier
from hf_specdiff.costs_specdiff import CACHE_KWARG
torch.set_num_threads(2); torch.set_grad_enabled(False)
print(torch.backends.cpu.get_cpu_capability())
model, tok = load_verifier(DEFAULT_VERIFIER, dtype=torch.bfloat16)[:2]
lins = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
w32 = {m: m.weight.float() for m in lins}
@contextlib.contextmanager
def fp32_linears(mode):
    for m in lins:
        if mode == "cached":
            m.forward = (lambda m: lambda x: F.linear(x.float(), w32[m]).to(x.dtype))(m)
        elif mode == "upcast":
            m.forward = (lambda m: lambda x: F.linear(x.float(), m.weight.float()).to(x.dtype))(m)
    try: yield
    finally:
        for m in lins: m.__dict__.pop("forward", None)
ids = torch.randint(1000, (1, 160))
cache = DynamicCache(config=model.config)
model(input_ids=ids[:, :128], use_cache=True, **{CACHE_KWARG: cache})
res = {}
for rep in range(6):
    for n in (1, 2, 4, 8, 16):
        for mode in ("bf16", "cached", "upcast"):
            c = copy.deepcopy(cache)
            with fp32_linears(mode):
                s = time.perf_counter()
                model(input_ids=ids[:, 128:128+n], use_cache=True, logits_to_keep=n, **{CACHE_KWARG: c})
                t = time.perf_counter() - s
            if rep: res.setdefault((n, mode), []).append(t)
base = sorted(res[(1, "bf16")])[2]
for (n, mode), ts in sorted(res.items()):
    ts.sort(); print(f"n={n:2d} {mode:7s} {ts[len(ts)//2]*1000:7.1f} ms  {ts[len(ts)//2]/base:5.2f}x plain bf16")
