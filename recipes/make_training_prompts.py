"""Build the diverse training prompt set used for the shipped SmolLM2 drafter (never Spec-Bench).

Sources, all usable offline: GSM8K train questions and solutions (MIT, ../shared/data/gsm8k), docstrings and
source of the Python standard library installed here (PSF licence) as passages and code, and templated
instructions over hand-written topic lists. Kinds: maths, writing, QA/explanation, summarising given text,
translation, code, extraction, context-grounded QA.

    python recipes/make_training_prompts.py --out runs/train_prompts.jsonl --num 2400
"""

import argparse
import importlib
import inspect
import json
import random
import re
from pathlib import Path

TOPICS = ["a rainy afternoon", "learning to ride a bike", "the ocean at night", "a busy train station", "autumn leaves",
          "a lost dog finding its way home", "the first day at a new job", "a small bakery", "climbing a mountain",
          "friendship", "a power outage", "a garden in spring", "moving to a new city", "an old library",
          "a robot learning to paint", "a football match", "a snowy morning", "the smell of coffee", "a road trip",
          "a science fair", "a thunderstorm", "a family dinner", "a museum visit", "a village market", "the moon",
          "a birthday surprise", "learning a new language", "a quiet forest", "a lighthouse keeper", "a chess game",
          "recycling", "a volunteer day", "the last day of school", "a kite festival", "a night sky full of stars"]
FORMS = ["short poem", "short story", "haiku", "diary entry", "formal email", "blog post introduction",
         "product description", "thank-you letter", "short speech", "limerick", "news headline and summary"]
CONCEPTS = ["photosynthesis", "inflation", "machine learning", "the water cycle", "compound interest", "gravity",
            "the immune system", "supply and demand", "climate change", "vaccines", "blockchain", "democracy",
            "the greenhouse effect", "black holes", "DNA", "electricity", "the internet", "recursion in programming",
            "probability", "plate tectonics", "renewable energy", "the stock market", "evolution", "sleep",
            "a hash table", "encryption", "the Pythagorean theorem", "volcanoes", "antibiotics", "the French Revolution",
            "opportunity cost", "nutrition labels", "time zones", "the speed of light", "cloud computing",
            "a binary search", "the scientific method", "solar eclipses", "bacteria and viruses", "interest rates"]
PAIRS = [("a list", "a tuple in Python"), ("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "storage"),
         ("a democracy", "a monarchy"), ("speed", "velocity"), ("a lake", "a sea"), ("baking soda", "baking powder"),
         ("renting", "buying a home"), ("TCP", "UDP"), ("an alligator", "a crocodile"), ("mitosis", "meiosis"),
         ("a credit card", "a debit card"), ("stocks", "bonds"), ("a comet", "an asteroid"), ("HTML", "CSS")]
ACTIVITIES = ["staying focused while studying", "saving money", "sleeping better", "learning to cook",
              "preparing for a job interview", "running a first marathon", "keeping plants alive", "public speaking",
              "writing a good essay", "reducing stress", "traveling on a budget", "learning to code",
              "staying healthy in winter", "organizing a small party", "taking better photos", "managing time"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
              "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list",
              "computes the factorial of a number", "checks whether a string is a palindrome",
              "finds the largest element in a list", "converts Celsius to Fahrenheit",
              "returns the word frequencies of a text as a dictionary", "flattens a nested list",
              "computes the greatest common divisor of two numbers", "sorts a list of dictionaries by a key",
              "reads a CSV file and returns its rows", "validates an email address with a regular expression",
              "returns the second largest number in a list", "rotates a list by k positions",
              "checks whether two strings are anagrams", "computes the average of a list of numbers",
              "implements binary search", "transposes a matrix", "counts the lines in a file",
              "generates all permutations of a list", "converts a Roman numeral to an integer"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Chinese", "Japanese"]
STDLIB = ["json", "os", "re", "collections", "itertools", "functools", "pathlib", "datetime", "random", "string",
          "textwrap", "statistics", "heapq", "bisect", "csv", "argparse", "logging", "shutil", "fractions", "decimal",
          "calendar", "difflib", "enum", "dataclasses", "typing", "contextlib", "hashlib", "base64", "zipfile", "math"]


def stdlib_material():
    """(passages, code snippets, first sentences) from installed standard-library docstrings and source."""
    passages, snippets, sentences = [], [], []
    for name in STDLIB:
        module = importlib.import_module(name)
        for obj in [module, *vars(module).values()]:
            doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
            if getattr(obj, "__module__", name) not in (name, None) and not inspect.ismodule(obj):
                continue
            if doc and 300 <= len(doc) <= 1500 and ">>>" not in doc:
                passages.append(doc)
            if doc:
                first = re.split(r"(?<=\.)\s", doc.strip().split("\n\n")[0].replace("\n", " "))[0]
                if 40 <= len(first) <= 200:
                    sentences.append(first)
            if inspect.isfunction(obj):
                try:
                    source = inspect.getsource(obj)
                except (OSError, TypeError):
                    continue
                if 150 <= len(source) <= 900:
                    snippets.append(source)
    return sorted(set(passages)), sorted(set(snippets)), sorted(set(sentences))


def build(num: int, gsm8k: Path, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    gsm = [json.loads(line) for line in gsm8k.open()]
    passages, snippets, sentences = stdlib_material()
    gsm_sentences = [s for row in gsm for s in re.split(r"(?<=[.?!])\s", row["question"]) if 40 <= len(s) <= 200]
    solutions = [re.sub(r"<<.*?>>", "", row["answer"]).split("####")[0].strip() for row in gsm]

    makers = {
        "math": lambda: rng.choice(gsm)["question"],
        "writing": lambda: f"Write a {rng.choice(FORMS)} about {rng.choice(TOPICS)}.",
        "qa": lambda: rng.choice([
            f"Explain {rng.choice(CONCEPTS)} in simple terms.",
            f"What is {rng.choice(CONCEPTS)}? Answer in a short paragraph.",
            "What are the main differences between {} and {}?".format(*rng.choice(PAIRS)),
            f"Give me three tips for {rng.choice(ACTIVITIES)}.",
            f"Why is {rng.choice(CONCEPTS)} important?",
        ]),
        "summarize": lambda: rng.choice([
            f"Summarize the following text in two sentences.\n\n{rng.choice(passages)}",
            f"Summarize this solution in one sentence.\n\n{rng.choice(solutions)}",
            f"Give a one-paragraph summary of the following documentation.\n\n{rng.choice(passages)}",
        ]),
        "translate": lambda: f"Translate the following sentence into {rng.choice(LANGUAGES)}: "
                             f"{rng.choice(sentences + gsm_sentences)}",
        "code": lambda: rng.choice([
            f"Write a Python function that {rng.choice(CODE_TASKS)}.",
            f"Explain what this Python code does.\n\n```python\n{rng.choice(snippets)}```",
            f"Write a Python function that {rng.choice(CODE_TASKS)}, with a docstring and an example.",
        ]),
        "extract": lambda: rng.choice([
            f"Extract all the numbers mentioned in the following text and say what each refers to.\n\n"
            f"{rng.choice(gsm)['question']}",
            f"List the key facts in the following text as bullet points.\n\n{rng.choice(passages)}",
            f"Extract the names of the people and the items mentioned in this text.\n\n{rng.choice(gsm)['question']}",
        ]),
        "context_qa": lambda: (lambda p: f"Answer the question using only the context.\n\nContext: {p}\n\n"
                                         f"Question: What is this about, and what does it return or do?")(
            rng.choice(passages)),
    }
    weights = {"math": 0.2, "writing": 0.14, "qa": 0.16, "summarize": 0.1, "translate": 0.1, "code": 0.12,
               "extract": 0.1, "context_qa": 0.08}
    kinds = rng.choices(list(weights), weights=list(weights.values()), k=num * 3)
    prompts, seen = [], set()
    for kind in kinds:
        text = makers[kind]()
        if text not in seen:
            seen.add(text)
            prompts.append({"kind": kind, "prompt": text})
        if len(prompts) == num:
            break
    return prompts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--num", type=int, default=2400)
    parser.add_argument("--gsm8k", default=str(Path(__file__).resolve().parents[2] / "shared/data/gsm8k/train.jsonl"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    prompts = build(args.num, Path(args.gsm8k), args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(p) + "\n" for p in prompts)
    counts = {}
    for p in prompts:
        counts[p["kind"]] = counts.get(p["kind"], 0) + 1
    print(f"{len(prompts)} prompts -> {args.out}: {counts}")


if __name__ == "__main__":
    main()
