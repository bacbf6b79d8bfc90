"""Train a SpecDiff drafter for your own verifier, from Python (the same steps as the CLI).

    python examples/train_drafter.py --verifier PATH --prompts prompts.jsonl --out runs/my-drafter --steps 2000

1. sample verifier trajectories on your prompts (resumable), 2. train with the ce-streak objective (a drafter
conditioned on the verifier's hidden states by default; `--verifier-layers ''` for a standalone one),
3. report tau and acceptance by position on held-out prompts.
"""

import argparse
from pathlib import Path

import torch

from hf_specdiff.training.data import DistillDataConfig, make_distill_data, read_prompts
from hf_specdiff.training.evaluate import evaluate_drafter, format_report
from hf_specdiff.modeling_specdiff import SpecDiffDrafter
from hf_specdiff.training.trainer import TrainConfig, train
from hf_specdiff.tools.verifiers import load_verifier


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verifier", required=True, help="verifier folder or known name")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--eval-prompts", default=None, help="held-out prompts (default: the last 10%%)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--samples-per-prompt", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--verifier-layers", default="auto",
                        help="verifier layers a conditioned drafter reads ('auto', or '1,14,28'); '' = standalone")
    args = parser.parse_args()

    out = Path(args.out)
    prompts = read_prompts(args.prompts)
    eval_prompts = read_prompts(args.eval_prompts) if args.eval_prompts else prompts[-max(1, len(prompts) // 10):]
    train_prompts = prompts if args.eval_prompts else prompts[: len(prompts) - len(eval_prompts)]
    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.bfloat16)
    make_distill_data(verifier, tokenizer, train_prompts, out / "data",
                      DistillDataConfig(samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens))
    config = TrainConfig(verifier=args.verifier, data=str(out / "data"), out=str(out / "drafter"),
                         block_size=args.block_size, hidden_size=args.hidden_size,
                         draft_vocab_size=args.draft_vocab_size, max_steps=args.steps,
                         verifier_layers=args.verifier_layers,
                         seq_len=min(256, args.max_new_tokens + 64), save_every=max(1, args.steps // 5))
    drafter_dir = train(config)
    verifier, tokenizer = load_verifier(args.verifier, dtype=torch.float32)
    drafter = SpecDiffDrafter.from_pretrained(drafter_dir).eval()
    print(format_report(evaluate_drafter(verifier, tokenizer, drafter, eval_prompts, max_new_tokens=64)))


if __name__ == "__main__":
    main()
