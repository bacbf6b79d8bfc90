"""The drafter in a `pipeline("text-generation", assistant_model=...)`: same text as the plain pipeline, faster.

    python examples/pipeline.py --drafter model_cards/specdiff-smollm2-135m-instruct
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, pipeline

from hf_specdiff.tools.verifiers import load_verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompt", default="Write a haiku about the sea.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.float32)
    drafter = AutoModelForCausalLM.from_pretrained(args.drafter, trust_remote_code=True).eval()
    messages = [{"role": "user", "content": args.prompt}]
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    plain = pipeline("text-generation", model=verifier, tokenizer=tokenizer)(messages, **kwargs)
    # `attach` lets a conditioned drafter read the verifier's hidden states; a standalone drafter ignores it.
    fast = pipeline("text-generation", model=verifier, tokenizer=tokenizer,
                    assistant_model=drafter.attach(verifier))(messages, **kwargs)
    drafter.detach()
    print(fast[0]["generated_text"][-1]["content"])
    print(f"\nidentical to the plain pipeline: {fast[0]['generated_text'] == plain[0]['generated_text']}")


if __name__ == "__main__":
    main()
