"""What a verified token costs on this machine: the verifier's forward over k new tokens after a cached context,
relative to k = 1 (docs/tuning.md). Speculative decoding pays where these ratios stay near 1.

    python experiments/verifier_cost.py [--verifier NAME_OR_DIR] [--dtype bf16|fp32] [--attn sdpa|eager]
        [--context 300,1500] [--rows 1,2,4,8,16]
"""

import argparse
import time

import torch
from transformers import DynamicCache

from hf_specdiff.tools.threads import torch_threads
from hf_specdiff.tools.verifiers import load_verifier


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
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    parser.add_argument("--context", default="300", help="comma-separated context lengths")
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with torch_threads(args.threads):
        model, _ = load_verifier(args.verifier, dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
        model.set_attn_implementation(args.attn)
        contexts = [int(c) for c in args.context.split(",")]
        ms = {c: forward_ms(model, c, [int(k) for k in args.rows.split(",")]) for c in contexts}
    print(f"capability {torch.backends.cpu.get_cpu_capability()}, {args.dtype}, {args.attn}")
    for context, by_rows in ms.items():
        print(f"after {context} tokens: " + ", ".join(
            f"k={k} {value:.1f} ms ({value / by_rows[min(by_rows)]:.2f}x)" for k, value in by_rows.items()))
    return ms


if __name__ == "__main__":
    main()
