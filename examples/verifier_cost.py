"""What a verified token costs on this machine: the verifier's forward over k new tokens after a cached context,
relative to k = 1 (docs/tuning.md). Speculative decoding pays where these ratios stay near 1.

    python examples/verifier_cost.py [--verifier NAME_OR_DIR] [--dtype bf16|fp32] [--context 300] [--rows 1,2,4,8,16]
"""

import argparse
import time

import torch
from transformers import DynamicCache

from hf_specdiff.threads import torch_threads
from hf_specdiff.verifiers import load_verifier


@torch.no_grad()
def forward_ms(model, context: int, rows: list[int], repeats: int = 12) -> dict[int, float]:
    """Median milliseconds of one cached forward over k random new tokens, for each k in `rows`."""
    vocab = model.config.get_text_config().vocab_size
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.randint(0, vocab, (1, context)), past_key_values=cache, use_cache=True)
    result = {}
    for k in rows:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=torch.randint(0, vocab, (1, k)), past_key_values=cache, use_cache=True, logits_to_keep=k)
            times.append(time.perf_counter() - start)
            cache.crop(-k)
        result[k] = 1000 * sorted(times)[len(times) // 2]
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with torch_threads(args.threads):
        model, _ = load_verifier(args.verifier, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
        ms = forward_ms(model, args.context, [int(k) for k in args.rows.split(",")])
    print(f"capability {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {args.context} tokens of context")
    for k, value in ms.items():
        print(f"k={k:3d}: {value:7.1f} ms  ({value / ms[min(ms)]:.2f}x)")
    return ms


if __name__ == "__main__":
    main()
