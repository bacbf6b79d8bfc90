"""A verifier forward over n new tokens after a 128-token cache, as torch runs it and with the linear weights packed
for oneDNN (`costs_specdiff.PackedLinears`) at each batch they may be laid out for; SmolLM2-135M-Instruct fp32, 2
threads, interleaved, fastest of N (default 7), ms. Also the logits' largest difference from torch's and whether the
greedy tokens agree. Run: python docs/results/avx2-epyc-20261208-packed/packed_rows.py [N]"""
import os
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(2)
from transformers import DynamicCache  # noqa: E402

from hf_specdiff import costs_specdiff  # noqa: E402
from hf_specdiff.tools.verifiers import load_verifier  # noqa: E402

model = load_verifier(dtype=torch.float32)[0]
ids = torch.randint(1000, 20000, (1, 128 + 16), generator=torch.Generator().manual_seed(0))
cache = DynamicCache(config=model.config)
with torch.no_grad():
    model(input_ids=ids[:, :128], cache=cache, use_cache=True)
kernels = {"torch": None}
for batch in (1, 2, 4, 8):
    costs_specdiff.PACKING_BATCH = batch
    costs_specdiff.PackedLinears._kept.clear()
    kernels[f"packed for {batch}"] = costs_specdiff.PackedLinears(model)


def forward(n, packed):
    if packed is not None:
        packed.use()
    try:
        start = time.perf_counter()
        logits = model(input_ids=ids[:, 128:128 + n], cache=cache, use_cache=True, logits_to_keep=n).logits
        return time.perf_counter() - start, logits
    finally:
        cache.crop(-n)
        if packed is not None:
            packed.restore()


repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
print(f"n   " + "".join(f"{name:>16}" for name in kernels) + "   max |logits - torch's|, greedy tokens agree")
with torch.no_grad():
    for n in (1, 2, 3, 4, 8, 16):
        seconds = {name: [] for name in kernels}
        for repeat in range(repeats + 1):
            for name, packed in kernels.items():
                elapsed, logits = forward(n, packed)
                if repeat:
                    seconds[name].append(elapsed)
                if repeat == 1:
                    reference = logits if packed is None else reference
                    diff = 0.0 if packed is None else max(diff, float((logits - reference).abs().max()))
                    agree = True if packed is None else agree and torch.equal(logits.argmax(-1), reference.argmax(-1))
        print(f"{n:<4}" + "".join(f"{1000 * min(t):13.1f} ms" for t in seconds.values()) +
              f"   {diff:.1e}, {agree}", flush=True)
