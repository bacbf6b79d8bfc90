"""Translation requests *into English* for the drafter's training data, by back-translation (never Spec-Bench).

The builder's translation prompts go from English into other languages; users (and Spec-Bench's translation
category) ask the other way. Sources in other languages that can be had offline are few, so the verifier writes
them: `forward` asks it to translate English sentences (GSM8K questions' and the verifier's own Magpie requests'
sentences) into German (most), French, Spanish, Italian or Portuguese; `reverse` keeps its translations that are
not degenerate (no word run repeated, 4-60 words, at most half of them the English sentence's) and asks for them
in English.

    python recipes/make_back_translation_prompts.py forward --out runs/smollm2_v3/translate_forward.jsonl
    hf-specdiff distill-data --verifier smollm2-135m-instruct --prompts runs/smollm2_v3/translate_forward.jsonl \
        --out runs/smollm2_v3/data_translate_forward --temperature 0 --max-new-tokens 64
    python recipes/make_back_translation_prompts.py reverse --forward runs/smollm2_v3/translate_forward.jsonl \
        --data runs/smollm2_v3/data_translate_forward --out runs/smollm2_v3/translate_en.jsonl
"""

import argparse
import json
import random
import re
from pathlib import Path

LANGUAGES = ["German"] * 6 + ["French", "Spanish", "Italian", "Portuguese"]
SHARED = Path(__file__).resolve().parents[2] / "shared/data"


def english_sentences(magpie: Path, gsm8k: Path) -> list[str]:
    """Sentences of 6-30 words from GSM8K questions and Magpie requests, deduplicated, in a fixed order."""
    texts = [json.loads(line)["question"] for line in gsm8k.open()]
    texts += [json.loads(line)["prompt"] for line in magpie.open()] if magpie.exists() else []
    sentences = {s.strip() for text in texts for s in re.split(r"(?<=[.?!])\s+", text)}
    return sorted(s for s in sentences if 6 <= len(s.split()) <= 30 and s[-1] in ".?!")


def forward(args):
    rng = random.Random(args.seed)
    sentences = english_sentences(Path(args.magpie), Path(args.gsm8k))
    rows = [{"kind": "translate_forward", "language": (language := rng.choice(LANGUAGES)), "english": sentence,
             "prompt": f"Translate the following sentence into {language}: {sentence}"}
            for sentence in rng.sample(sentences, min(args.num, len(sentences)))]
    write(args.out, rows)


def degenerate(text: str, english: str) -> bool:
    """A translation not worth a reverse request: too short or long, a repeated word run, or mostly the English
    sentence's own words."""
    words = text.split()
    if not 4 <= len(words) <= 60 or len(set(words) & set(english.split())) > len(words) / 2:
        return True
    trigrams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(set(trigrams)) < len(trigrams)


def reverse(args):
    from transformers import AutoTokenizer

    from hf_specdiff.training.data import load_distill_data
    from hf_specdiff.tools.verifiers import prepare_verifier

    tokenizer = AutoTokenizer.from_pretrained(prepare_verifier(args.verifier))
    requests = [json.loads(line) for line in open(args.forward)]
    rows, seen = [], set()
    for row in load_distill_data(args.data)[1]:
        request = requests[row["prompt_index"]]
        text = tokenizer.decode(row["response_ids"], skip_special_tokens=True).strip().split("\n")[0].strip()
        if degenerate(text, request["english"]) or text in seen:
            continue
        seen.add(text)
        rows.append({"kind": "translate_en", "language": request["language"],
                     "prompt": f"Translate {request['language']} to English: {text}"})
    write(args.out, rows)


def write(path, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"{len(rows)} prompts -> {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    first = steps.add_parser("forward", help="English sentences to translate out of English")
    first.add_argument("--out", required=True)
    first.add_argument("--num", type=int, default=2400)
    first.add_argument("--magpie", default="runs/smollm2_v3/magpie.jsonl")
    first.add_argument("--gsm8k", default=str(SHARED / "gsm8k/train.jsonl"))
    first.add_argument("--seed", type=int, default=0)
    second = steps.add_parser("reverse", help="the verifier's translations, to translate back into English")
    second.add_argument("--forward", required=True, help="the prompts of the `forward` step")
    second.add_argument("--data", required=True, help="the verifier's greedy responses to them (distill-data)")
    second.add_argument("--out", required=True)
    second.add_argument("--verifier", default="smollm2-135m-instruct")
    args = parser.parse_args()
    forward(args) if args.step == "forward" else reverse(args)


if __name__ == "__main__":
    main()
