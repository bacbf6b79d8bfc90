"""Self-synthesised training prompts (Magpie, arXiv 2406.08464): fed only its chat template up to the opening of a
user turn, an aligned model writes a user request itself, in the distribution it was tuned on.

`synthesize_prompts` samples such requests in batches, keeps those that read as requests (`is_request`), drops
near-duplicates and appends them to a jsonl file of `{"prompt": ..., "source": "magpie"}` rows that `read_prompts`
takes. A run that is stopped and started again goes on from the last finished batch (`<out>.meta.json`, which
also sums the tokens generated and the seconds it took over every run).
"""

import json
import re
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .batch_generation import generate_batch

_MARKER = "\u2603magpie\u2603"
REQUEST_STARTS = {"write", "explain", "describe", "give", "list", "how", "what", "why", "when", "where", "which",
                  "who", "can", "could", "would", "should", "is", "are", "do", "does", "please", "tell", "create",
                  "help", "summarize", "summarise", "translate", "compare", "suggest", "i", "i'm", "my", "generate",
                  "make", "find", "design", "plan", "provide", "calculate", "solve", "rewrite", "name", "imagine"}


def user_turn(tokenizer) -> tuple[list[int], set[int]]:
    """The token ids of the chat template up to where a user's message starts, and the ids that end the message
    (the template's end-of-turn token and the tokenizer's EOS)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}], tokenize=False)
    if _MARKER not in text:
        raise ValueError("the tokenizer's chat template does not show the user's message: no Magpie prompts")
    before, after = text.split(_MARKER, 1)
    prefix = tokenizer(before, add_special_tokens=False)["input_ids"]
    if not prefix:
        raise ValueError("the chat template has nothing before the user's message to start a user turn from")
    ends = {tokenizer(after, add_special_tokens=False)["input_ids"][0]} if after.strip() else set()
    if tokenizer.eos_token_id is not None:
        ends.add(tokenizer.eos_token_id)
    return prefix, ends


def is_request(text: str) -> bool:
    """Whether a synthesised user turn reads as a request: a plausible length, not repetitive, asking something."""
    words = text.split()
    if not 12 <= len(text) <= 1200 or len(words) < 3 or "<|" in text:
        return False
    if len(words) >= 10 and len({w.lower() for w in words}) < 0.5 * len(words):
        return False
    first = re.sub(r"[^a-z']", "", words[0].lower())
    return "?" in text or first in REQUEST_STARTS


def normalize(text: str) -> str:
    """The form near-duplicates share: lower case, letters and digits only."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def synthesize_prompts(verifier, tokenizer, num_prompts: int, out, batch_size: int = 64, temperature: float = 1.0,
                       top_p: float = 0.95, max_new_tokens: int = 128, seed: int = 0, keep=is_request,
                       progress: bool = True) -> Path:
    """Append user requests written by `verifier` to the jsonl file `out` until it holds `num_prompts` (resumable).

    Only turns that end within `max_new_tokens` with the template's end-of-turn token, pass `keep` and differ from
    every kept one once normalized are written."""
    out = Path(out)
    meta_path = out.with_suffix(".meta.json")
    settings = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed,
                "batch_size": batch_size}
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"settings": settings, "batches": 0,
                                                                         "turns": 0, "kept": 0}
    if meta["settings"] != settings:
        raise ValueError(f"{out} was made with other settings ({meta['settings']}): use another file")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    seen = {normalize(row["prompt"]) for row in rows}
    prefix, ends = user_turn(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(ends))
    bar = tqdm(total=num_prompts, initial=min(len(seen), num_prompts), desc="synth-prompts", disable=not progress)
    while len(seen) < num_prompts:
        generator = torch.Generator(verifier.device).manual_seed(seed * 1_000_003 + meta["batches"])
        start = time.perf_counter()
        turns = generate_batch(verifier, [prefix] * batch_size, max_new_tokens, ends, pad_id, temperature, top_p,
                               generator).responses
        seconds = time.perf_counter() - start
        kept = []
        for turn in turns:
            if not turn or turn[-1] not in ends:  # rambled past the token budget
                continue
            text = tokenizer.decode(turn[:-1], skip_special_tokens=True).strip()
            if text and keep(text) and normalize(text) not in seen and len(seen) < num_prompts:
                seen.add(normalize(text))
                kept.append(json.dumps({"prompt": text, "source": "magpie"}))
        with out.open("a") as f:
            f.write("".join(line + "\n" for line in kept))
        meta["batches"], meta["turns"], meta["kept"] = meta["batches"] + 1, meta["turns"] + len(turns), len(seen)
        meta["generated_tokens"] = meta.get("generated_tokens", 0) + sum(map(len, turns))
        meta["generation_seconds"] = round(meta.get("generation_seconds", 0.0) + seconds, 1)
        meta["tok_s"] = round(meta["generated_tokens"] / max(meta["generation_seconds"], 1e-9), 1)
        meta_path.write_text(json.dumps(meta, indent=2))
        bar.update(len(kept))
    bar.close()
    return out
