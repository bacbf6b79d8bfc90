"""What a plain step costs in each loop against plain `generate`: every draft-length decision forced to 0 (no
drafting, no probes, no lookup drafts) and every tree budget to 0 nodes, so every round of `hf_specdiff.generate`
(K=1, and K=4 + lookup, which still finds its lookup drafts and sizes a tree for them) and of the drop-in path is a
plain step. Per token, the verifier's forwards (hooked, the prompt's left out) and the rest (the loop's bookkeeping,
the prompt's forward). Where a path stays at tau ~1.0 this is what it loses. Methods interleaved, order reversed
every other repeat:

    python experiments/plain_step_overhead.py [--verifier NAME_OR_DIR] [--drafter DIR] [--dtype bf16|fp32]
        [--max-new-tokens 128] [--repeats 4]
"""

import argparse
import time

import torch

import hf_specdiff
from hf_specdiff import decoding
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.policies_specdiff import DraftLengthPolicy
from hf_specdiff.tools.doctor import DTYPES
from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.verifiers import load_verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", help="a drafter folder (default: the shipped one)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--prompt", default="Write a poem about the sea.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    verifier, tokenizer = load_verifier(args.verifier, dtype=DTYPES[args.dtype])
    drafter = SpecDiffDrafter.from_pretrained(args.drafter or shipped_drafter_path(), dtype=DTYPES[args.dtype]).eval()
    DraftLengthPolicy.next_length = lambda self, *args, **kwargs: 0  # every round a plain step
    decoding.tree_budget = lambda probs, costs, max_nodes: 0  # a tree's lookup drafts found and weighed, none verified
    drafter.assistant_lookup_tokens = 0
    assistant = drafter.attach(verifier) if drafter.config.is_conditioned else drafter
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    settings = dict(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens, do_sample=False)
    methods = {"plain generate": lambda: verifier.generate(**inputs, **settings),
               "K=1 loop": lambda: hf_specdiff.generate(verifier, drafter, **inputs, **settings, num_drafts=1),
               "K=4 + lookup loop": lambda: hf_specdiff.generate(verifier, drafter, **inputs, **settings, num_drafts=4,
                                                                 lookup_tokens=10),
               "drop-in loop": lambda: verifier.generate(**inputs, **settings, assistant_model=assistant)}
    marks = []  # -start, end of each verifier forward
    verifier.register_forward_pre_hook(lambda *_: marks.append(-time.perf_counter()))
    verifier.register_forward_hook(lambda *_: marks.append(time.perf_counter()))
    for method in methods.values():  # warm-up, and the cost profile measured once
        method()
    totals = {name: [0.0, 0.0] for name in methods}
    for repeat in range(args.repeats):
        for name in list(methods) if repeat % 2 == 0 else list(methods)[::-1]:
            marks.clear()
            start = time.perf_counter()
            methods[name]()
            totals[name][0] += time.perf_counter() - start
            totals[name][1] += sum(marks[2:])  # the prompt's forward left out
    steps = args.repeats * (args.max_new_tokens - 1)
    for name, (total, forwards) in totals.items():
        print(f"{name}: {1000 * total / steps:.2f} ms a token, of which verifier forwards {1000 * forwards / steps:.2f} ms,"
              f" the rest {1000 * (total - forwards) / steps:.2f} ms ({total / totals['plain generate'][0]:.3f}x plain)")


if __name__ == "__main__":
    main()
