"""`hf-specdiff demo`: stream an answer with SpecDiff decoding, then compare it with plain greedy decoding."""

import time
from pathlib import Path

import torch
from transformers import TextStreamer

from .compat import check_compatibility
from .decoding import SpecDiffStats, generate
from .modeling_specdiff import SpecDiffDrafter
from .verifiers import DEFAULT_VERIFIER, load_verifier

SHIPPED_DRAFTER = Path(__file__).resolve().parents[1] / "model_cards" / "specdiff-smollm2-135m-instruct"


def run_demo(prompt: str, verifier: str = DEFAULT_VERIFIER, drafter: str | None = None, num_drafts: int = 4,
             lookup_tokens: int = 10, max_new_tokens: int = 128, dtype=torch.bfloat16, threads: int = 2) -> dict:
    """Stream SpecDiff's answer to `prompt`, time plain greedy on the same input, print and return the comparison."""
    torch.set_num_threads(threads)
    drafter_path = Path(drafter) if drafter else SHIPPED_DRAFTER
    if not (drafter_path / "config.json").exists():
        raise FileNotFoundError(f"no drafter at {drafter_path}: pass --drafter DIR (a SpecDiff drafter folder)")
    model, tokenizer = load_verifier(verifier, dtype=dtype)
    draft_model = SpecDiffDrafter.from_pretrained(drafter_path, dtype=dtype).eval()
    check_compatibility(model, draft_model)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    prompt_len = inputs["input_ids"].shape[1]
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    options = dict(num_drafts=num_drafts, lookup_tokens=lookup_tokens)

    # One short untimed run of each first, so neither timed run pays one-time start-up costs.
    generate(model, draft_model, **inputs, **options, max_new_tokens=4, do_sample=False)
    model.generate(**inputs, max_new_tokens=4, do_sample=False)

    stats = SpecDiffStats()
    start = time.perf_counter()
    fast = generate(model, draft_model, **inputs, **options, stats=stats,
                    streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **kwargs)
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    plain = model.generate(**inputs, **kwargs)
    plain_s = time.perf_counter() - start

    result = {"plain_tok_s": (plain.shape[1] - prompt_len) / plain_s,
              "specdiff_tok_s": (fast.shape[1] - prompt_len) / fast_s, "tau": stats.tau,
              "identical": fast.tolist() == plain.tolist(), "num_drafts": num_drafts, "lookup_tokens": lookup_tokens,
              "dtype": str(dtype)}
    result["speedup"] = result["specdiff_tok_s"] / result["plain_tok_s"]
    method = f"SpecDiff-2 (K={num_drafts}" + (f", lookup {lookup_tokens})" if lookup_tokens else ")")
    print(f"\nplain {result['plain_tok_s']:.1f} tok/s | {method} {result['specdiff_tok_s']:.1f} tok/s"
          f" | speed-up {result['speedup']:.2f}x | tau {stats.tau:.2f} | identical to plain greedy: "
          f"{result['identical']}" + ("" if result["identical"] or dtype == torch.float32 else
                                      " (bf16 verification rounds differently from single steps; use --dtype fp32 "
                                      "for exact equality)"))
    return result
