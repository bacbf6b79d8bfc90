"""What a verified token costs on this machine: the verifier's forward over k new tokens after a cached context,
relative to k = 1 (docs/tuning.md). Speculative decoding pays where these ratios stay near 1. With `--tree`, also
the forward over the last committed token and k - 1 tree nodes in 4 branches, under the tree loop's own 4D mask
(`decoding.TreeDecoding.verify`), each right after the chain forward of the same k: what a `CostProfile`, which times
chains, leaves out of a tree round.

    python experiments/verifier_cost.py [--verifier NAME_OR_DIR] [--dtype bf16|fp32] [--attn sdpa|eager]
        [--context 300,1500] [--rows 1,2,4,8,16] [--tree] [--onednn on|off]

`--onednn off` runs torch's matrix products without oneDNN (as `CostProfile.verifier_kernels` does for forwards over
few tokens where that is faster): on the 2-core AMD EPYC (`avx512_bf16`, no AMX) in bf16 after 128 tokens
(2026-12-07, torch 2.13.0-2.15.0), k=1 took 22-23 ms without it against 32-40 ms with it, k=4 as long, k=16 133 ms
against 50-54 ms (docs/tuning.md).

On the 2-core AMD EPYC (`avx512_bf16`, no AMX) in bf16 (2026-12-06, `--context 128,512 --rows 1,2,4,8,12,16
--tree`), a tree forward cost 0.91x-1.15x the chain of as many tokens under the AVX2 imitation (two runs, 20 pairs,
median 0.96x) and 0.87x-1.01x natively: a tree's mask adds nothing measurable, and a profile's chain forwards price
tree rounds.
"""

import argparse
import time

import torch
from transformers import DynamicCache

from hf_specdiff import decoding
from hf_specdiff.costs_specdiff import CACHE_KWARG
from hf_specdiff.tools.threads import torch_threads
from hf_specdiff.tools.verifiers import load_verifier


def tree_of(num_nodes: int, vocab: int, branches: int = 4) -> decoding.DraftTree:
    """A tree of `num_nodes` random nodes in `branches` branches as deep as they need (the last ones shallower)."""
    depth = -(-num_nodes // branches)
    sizes = [min(depth, num_nodes - depth * b) for b in range(branches)]
    return decoding.DraftTree.from_drafts([torch.randint(0, vocab, (size,)).tolist() for size in sizes if size > 0])


def tree_forward(model, cache, token: torch.Tensor, tree: decoding.DraftTree) -> torch.Tensor:
    """The tree loop's verifier forward (`decoding.tree_forward`) over one committed `token` [1, 1] and `tree`: logits
    [1, 1 + len(tree), V], row 1 + n at node n."""
    return decoding.tree_forward(model, cache, torch.cat([token, tree.tokens[None]], dim=1), 1, tree, use_cache=True,
                                 logits_to_keep=1 + len(tree)).logits


@torch.no_grad()
def forward_ms(model, context: int, rows: list[int], repeats: int = 12, tree: bool = False) -> dict[int, float]:
    """Median milliseconds of one cached forward over k random new tokens, for each k in `rows`; with `tree`, also
    of a tree forward of k tokens (key `-k`), each timed right after the chain of the same k."""
    vocab = model.config.get_text_config().vocab_size
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.randint(0, vocab, (1, context)), **{CACHE_KWARG: cache}, use_cache=True)
    times = {}
    for k in rows:
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=torch.randint(0, vocab, (1, k)), **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=k)
            times.setdefault(k, []).append(time.perf_counter() - start)
            cache.crop(-k)
            if tree and k > 1:
                nodes = tree_of(k - 1, vocab)
                start = time.perf_counter()
                tree_forward(model, cache, torch.randint(0, vocab, (1, 1)), nodes)
                times.setdefault(-k, []).append(time.perf_counter() - start)
                cache.crop(-k)
    return {k: 1000 * sorted(values)[len(values) // 2] for k, values in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    parser.add_argument("--context", default="300", help="comma-separated context lengths")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tree", action="store_true", help="also time tree forwards of as many tokens")
    parser.add_argument("--onednn", default="on", choices=["on", "off"], help="off: matrix products without oneDNN")
    args = parser.parse_args(argv)
    initial, torch.backends.mkldnn.enabled = torch.backends.mkldnn.enabled, args.onednn == "on"
    try:
        with torch_threads(args.threads):
            model, _ = load_verifier(args.verifier, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
            model.set_attn_implementation(args.attn)
            contexts = [int(c) for c in args.context.split(",")]
            ms = {c: forward_ms(model, c, [int(k) for k in args.rows.split(",")], tree=args.tree) for c in contexts}
    finally:
        torch.backends.mkldnn.enabled = initial
    print(f"capability {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {args.attn}, oneDNN {args.onednn}")
    for context, by_rows in ms.items():
        first = by_rows[min(k for k in by_rows if k > 0)]
        print(f"after {context} tokens: " + ", ".join(
            f"k={k} {value:.1f} ms ({value / first:.2f}x)" for k, value in by_rows.items() if k > 0))
        trees = [k for k in by_rows if k > 0 and -k in by_rows]
        if trees:
            print(f"  tree / chain after {context} tokens: " + ", ".join(
                f"k={k} {by_rows[-k]:.1f} ms ({by_rows[-k] / by_rows[k]:.2f})" for k in trees))
    return ms


if __name__ == "__main__":
    main()
