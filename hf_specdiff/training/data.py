"""Distillation data: verifier-sampled trajectories on training prompts, stored as token ids.

`make_distill_data` samples `samples_per_prompt` responses per prompt from the verifier (its chat template applied)
and appends them to jsonl shards in `out/`, one batch at a time (written, flushed and fsynced together), with the
generation throughput in `out/stats.json`. A run
that is killed and started again with the same arguments skips what is on disk and produces the same rows as an
uninterrupted run: batches are fixed by the prompt order and each is sampled with its own seed.
"""

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .batch_generation import generate_batch
from .feature_cache import FeatureShardWriter

FORMAT_VERSION = 2  # 2: responses from `generate_batch` (1: transformers' generate)
SHARD_ROWS = 10000


@dataclass
class DistillDataConfig:
    """Settings of one distillation data set (stored in `meta.json`; a resumed run must use the same).

    `temperature` 0 takes the verifier's greedy response: the trajectories greedy decoding will meet."""

    samples_per_prompt: int = 4
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_prompt_tokens: int = 1024
    seed: int = 0
    chat_template: bool = True


def verifier_identity(model, name_or_path: str | None = None) -> dict:
    """What identifies the verifier that made a data set: vocabulary size and a fingerprint of its weights."""
    config = model.config.get_text_config()
    embedding = model.get_input_embeddings().weight
    digest = hashlib.sha256()
    digest.update(json.dumps([config.model_type, config.vocab_size, config.hidden_size,
                              getattr(config, "num_hidden_layers", None)]).encode())
    # rounded to bf16 first, so the same verifier loaded in fp32 or bf16 has one fingerprint
    digest.update(embedding[:64].detach().cpu().to(torch.bfloat16).float().numpy().tobytes())
    return {"name_or_path": name_or_path or getattr(config, "_name_or_path", None) or None,
            "vocab_size": config.vocab_size, "fingerprint": digest.hexdigest()[:16]}


def _prompt_text(row: dict, line_no: int, path) -> str | list:
    for key in ("messages", "prompt", "instruction", "question", "text"):
        if key in row:
            value = row[key]
            if key == "instruction" and row.get("input"):
                value = f"{value}\n\n{row['input']}"
            break
    else:
        if isinstance(row.get("turns"), list) and row["turns"]:
            value = row["turns"][0]
        else:
            raise ValueError(f"{path}:{line_no}: no prompt field (expected one of messages, prompt, instruction, "
                             "question, text, turns)")
    if not value or not isinstance(value, (str, list)):
        raise ValueError(f"{path}:{line_no}: empty or malformed prompt")
    return value


def read_prompts(path) -> list[str | list]:
    """Prompts from a jsonl file: each row's `messages` (chat), `prompt`, `instruction` (+ `input`), `question`,
    `text`, or first of `turns`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    prompts = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: each line must be a JSON object")
            prompts.append(_prompt_text(row, line_no, path))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def encode_prompt(tokenizer, prompt, chat_template: bool, max_tokens: int) -> list[int]:
    """Token ids of a prompt, through the chat template when there is one."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    else:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        ids = tokenizer(text)["input_ids"]
    return list(ids)[-max_tokens:]


def _read_rows(out: Path) -> list[dict]:
    """Rows on disk; a last line cut short by a crash is dropped from its shard."""
    rows = []
    for shard in sorted(out.glob("data-*.jsonl")):
        data = shard.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):
            shard.write_bytes(keep)
        rows += [json.loads(line) for line in keep.splitlines() if line.strip()]
    return rows


def load_distill_data(path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a distillation data folder; each row has `prompt_ids` and `response_ids`."""
    path = Path(path)
    if not (path / "meta.json").exists():
        raise FileNotFoundError(f"{path} is not a distillation data folder (no meta.json): make one with "
                                "`hf-specdiff distill-data`")
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return json.loads((path / "meta.json").read_text()), rows


@torch.no_grad()
def make_distill_data(verifier, tokenizer, prompts: list, out, config: DistillDataConfig | None = None,
                      batch_size: int = 16, verifier_name: str | None = None, progress: bool = True,
                      max_samples: int | None = None, verifier_layer_ids: list[int] | None = None) -> Path:
    """Sample responses from `verifier` for `prompts` into `out/` (resumable; see the module docstring).

    `max_samples` stops after that many samples of the work list (shortest prompts first): a smaller data set that a
    later run with a larger limit extends. `verifier_layer_ids` also keeps the verifier's hidden states after those
    layers at every token, read while generating, as the feature cache of a conditioned drafter that reads them
    (`feature_cache.attach_features`): training with `--feature-cache` then needs no teacher forward over the
    data."""
    config = config or DistillDataConfig()
    if config.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {config.temperature}")
    if config.temperature == 0 and config.samples_per_prompt > 1:
        raise ValueError("temperature 0 (greedy) gives one response per prompt: use samples_per_prompt=1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the dtype too: greedy responses (and kept hidden states) of an fp32 and a bf16 verifier differ
    meta = {"format_version": FORMAT_VERSION, "verifier": verifier_identity(verifier, verifier_name),
            "dtype": str(verifier.dtype).removeprefix("torch."), "num_prompts": len(prompts),
            "settings": asdict(config)}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        old.setdefault("dtype", meta["dtype"])  # folders made before the dtype was recorded
        differ = {k: (old.get(k), meta[k]) for k in meta if old.get(k) != meta[k]}
        if differ:
            raise ValueError(f"{out} holds data made with other settings, another verifier or another dtype (then, "
                             f"now: {differ}): use a new --out folder")
    else:
        meta_path.write_text(json.dumps(meta, indent=2))

    done = {(r["prompt_index"], r["sample_index"]) for r in _read_rows(out)}
    encoded = [encode_prompt(tokenizer, p, config.chat_template, config.max_prompt_tokens) for p in prompts]
    work = sorted(((i, s) for i in range(len(prompts)) for s in range(config.samples_per_prompt)),
                  key=lambda item: (len(encoded[item[0]]), item))  # similar lengths batch together
    work = work[:max_samples] if max_samples else work
    batches = [work[i : i + batch_size] for i in range(0, len(work), batch_size)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos_ids = verifier.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids] if eos_ids is not None else [])
    device = verifier.device
    throughput = Throughput(out)
    written = len(done)
    features = FeatureShardWriter(out, verifier_layer_ids, len(work)) if verifier_layer_ids else None
    hidden_states = [i + 1 for i in verifier_layer_ids] if verifier_layer_ids else None
    shard = out / f"data-{written // SHARD_ROWS:05d}.jsonl"

    bar = tqdm(total=len(work), initial=len(done), desc="distill-data", unit="sample", disable=not progress)
    for batch_index, batch in enumerate(batches):
        if all(item in done for item in batch):
            continue
        generator = torch.Generator(device).manual_seed(config.seed * 1_000_003 + batch_index)
        start = time.perf_counter()
        generation = generate_batch(verifier, [encoded[i] for i, _ in batch], config.max_new_tokens, eos_ids, pad_id,
                                    config.temperature, config.top_p, generator, output_hidden_states=hidden_states)
        throughput.add(sum(map(len, generation.responses)), time.perf_counter() - start)
        lines, new_states = [], []
        states = generation.hidden_states or [None] * len(batch)
        for (prompt_index, sample_index), response, row_states in zip(batch, generation.responses, states):
            if (prompt_index, sample_index) in done:  # kept from a batch a crash cut short
                continue
            lines.append(json.dumps({"prompt_index": prompt_index, "sample_index": sample_index,
                                     "prompt_ids": encoded[prompt_index], "response_ids": response}))
            new_states.append(row_states)
        with shard.open("a") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if features is not None:  # after the rows are on disk
            for row, row_states in enumerate(new_states, written):
                features.add(row, row_states)
        written += len(lines)
        shard = out / f"data-{written // SHARD_ROWS:05d}.jsonl"
        throughput.save()
        bar.update(len(lines))
        bar.set_postfix(tok_s=f"{throughput.tok_s:.0f}")
    bar.close()
    return out


class Throughput:
    """Generated tokens and generation seconds of a data folder, summed over every run that wrote to it
    (`stats.json`, rewritten after each batch)."""

    def __init__(self, out: Path):
        self.path = out / "stats.json"
        stats = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.tokens, self.seconds = stats.get("response_tokens", 0), stats.get("generation_seconds", 0.0)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add(self, tokens: int, seconds: float):
        self.tokens += tokens
        self.seconds += seconds

    def save(self):
        self.path.write_text(json.dumps({"response_tokens": self.tokens, "generation_seconds": round(self.seconds, 1),
                                         "tok_s": round(self.tok_s, 1)}, indent=2))
