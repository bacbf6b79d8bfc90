"""Which free signal tells, before verifying, whether the drafter's first token will be accepted? Along the verifier's
greedy answers (bf16), at every anchor position t: the verifier's confidence in the anchor x_t (the max softmax
of its logits at t - 1), the drafter's confidence in its first draft token (the max softmax of its logits), and
whether that token equals the verifier's next greedy token. Prints acceptance by confidence bucket.

    python experiments/draft_confidence.py PROMPTS.jsonl [PROMPTS.jsonl ...] --num-prompts 8 --out FILE.json

Prompt files are jsonl rows with "prompt" or "question" (training-side sets: never Spec-Bench); the last
`--num-prompts` rows of each file are used.
"""

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

from hf_specdiff.tools.shipped import shipped_drafter_path
from hf_specdiff.tools.threads import torch_threads
from hf_specdiff.tools.verifiers import prepare_verifier

BUCKETS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01))


@torch.no_grad()
def positions(verifier, drafter, prompt_ids: torch.Tensor, max_new_tokens: int) -> list[tuple[float, float, int]]:
    """(verifier confidence in the anchor, drafter confidence, accepted) at every anchor of the greedy answer."""
    out = verifier.generate(prompt_ids, max_new_tokens=max_new_tokens, do_sample=False)
    anchor_confidence = verifier(out).logits[0].float().softmax(-1).max(-1).values  # the hooks record features too
    cache = drafter.new_cache()
    cache.verifier_features = drafter._hooks.features
    rows = []
    for t in range(prompt_ids.shape[1], out.shape[1] - 1):
        draft, scores = drafter.draft(out[:, : t + 1], cache, 1, LogitsProcessorList())
        rows.append((anchor_confidence[t - 1].item(), scores[0].softmax(-1).max().item(),
                     int(draft[0, 0] == out[0, t + 1])))
    return rows


def by_bucket(rows: torch.Tensor, column: int) -> list[dict]:
    table = []
    for low, high in BUCKETS:
        inside = (rows[:, column] >= low) & (rows[:, column] < high)
        table.append({"confidence": [low, min(high, 1.0)], "share": round(inside.float().mean().item(), 3),
                      "acceptance": round(rows[inside, 2].mean().item(), 3) if inside.any() else None})
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--num-prompts", type=int, default=8, help="from the end of each file")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafter", default=None, help="default: the shipped drafter")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with torch_threads(2):
        path = prepare_verifier("smollm2-135m-instruct")
        tokenizer = AutoTokenizer.from_pretrained(path)
        verifier = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
        drafter = AutoModelForCausalLM.from_pretrained(args.drafter or shipped_drafter_path(),
                                                       dtype=torch.bfloat16).eval().attach(verifier)
        rows = []
        for file in args.prompts:
            lines = [json.loads(line) for line in open(file) if line.strip()][-args.num_prompts:]
            for line in lines:
                chat = [{"role": "user", "content": line.get("prompt") or line["question"]}]
                ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)["input_ids"]
                rows += positions(verifier, drafter, ids, args.max_new_tokens)
    table = torch.tensor(rows)
    result = {"positions": len(rows), "acceptance": round(table[:, 2].mean().item(), 3),
              "by_verifier_confidence_in_anchor": by_bucket(table, 0), "by_drafter_confidence": by_bucket(table, 1),
              "settings": vars(args)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=1))


if __name__ == "__main__":
    main()
