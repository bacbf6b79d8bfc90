"""Hub-ready folders: the self-selection loop as a `custom_generate` repository."""

import inspect
import json
from pathlib import Path

from .. import decoding

CUSTOM_GENERATE_README = """---
library_name: transformers
tags:
  - custom_generate
  - speculative-decoding
  - hf_specdiff
---

# SpecDiff-2 decoding (`custom_generate`)

Lossless speculative decoding with a SpecDiff diffusion drafter and SpecDiff-2 self-selection: the drafter's one
forward pass gives per-position marginals, K drafts drawn from them are verified together as a prefix tree in
one verifier forward, and the longest accepted path is kept. Greedy output equals plain greedy decoding; sampled
output has exactly the verifier's distribution (multi-candidate speculative sampling).

```python
from transformers import AutoModelForCausalLM
verifier = AutoModelForCausalLM.from_pretrained("<verifier>")
drafter = AutoModelForCausalLM.from_pretrained("<specdiff drafter for it>", trust_remote_code=True)
out = verifier.generate(**inputs, custom_generate="<this repo or folder>", trust_remote_code=True,
                        drafter=drafter, num_drafts=8, max_new_tokens=256)
```

Arguments beyond `generate`'s own: `drafter` (required), `num_drafts` (K, default 1), `draft_length`
(default: adapted to measured acceptance), `lookup_tokens` (prompt-lookup drafts of up to this many tokens in
each round's tree; default 0, none), `num_lookup_drafts` (how many: the distinct continuations of the latest
matches; default 4), `max_tree_nodes` (greedy tree size, lookup drafts included; default: sized each round by
measured cost), `cost_profile` (a `CostProfile` of this machine's verifier and drafter forwards; default: measured
once per machine and model and cached, see `hf_specdiff.costs_specdiff.cost_profile`), `streamer`, `stats` (a
`SpecDiffStats` to fill). Batch size 1.
The verifier needs an attention implementation that takes a 4D mask (`sdpa` or `eager`) when K > 1 or
`lookup_tokens` > 0.

The code is `hf_specdiff/decoding.py` of the hf_specdiff package, which imports only torch and transformers.
"""


def export_custom_generate(path) -> Path:
    """Write a Hub `custom_generate` repository (README + custom_generate/generate.py) to `path`; return it."""
    path = Path(path)
    (path / "custom_generate").mkdir(parents=True, exist_ok=True)
    (path / "custom_generate" / "generate.py").write_text(inspect.getsource(decoding))
    (path / "README.md").write_text(CUSTOM_GENERATE_README)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Drafter model folders: card, validation, upload

MAX_WEIGHTS_MB = 40
# the drafter's remote code: what `save_pretrained` copies into a folder (the model's file and what it imports)
REMOTE_CODE_FILES = ("configuration_specdiff.py", "modeling_specdiff.py", "generation_specdiff.py", "policies_specdiff.py",
                     "costs_specdiff.py")
REQUIRED_FILES = ("config.json", "generation_config.json", *REMOTE_CODE_FILES, "model.safetensors", "README.md")
CARD_KEYS = ("library_name", "pipeline_tag", "base_model", "license", "datasets", "tags")


def render_card(folder, base_model: str, bench: dict | list[tuple[str, dict]] | None = None,
                recipe: dict | None = None, license: str = "apache-2.0", datasets: tuple[str, ...] = (),
                reproduce: str | None = None) -> str:
    """The model card (README.md) of a drafter folder: metadata, usage, benchmark tables and training recipe.
    `datasets` are the Hub ids of the datasets its training prompts came from (none: `datasets: []`).

    `bench` is one `hf-specdiff bench` summary, or a list of (title, summary): each becomes its own section, all
    rendered from the results, so a re-render loses nothing written by hand."""
    from .bench import markdown_table

    config = json.loads((Path(folder) / "config.json").read_text())
    name = Path(folder).resolve().name
    layers = config.get("verifier_layer_ids")
    dflash = config.get("layout") == "dflash"
    assistant = "drafter.attach(verifier)" if layers else "drafter"
    tags = ("speculative-decoding", "diffusion", "specdiff", "hf_specdiff", "assistant-model", *(("dflash",) * dflash))
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation", f"base_model: {base_model}",
             f"license: {license}", *(["datasets:", *[f"  - {d}" for d in datasets]] if datasets else ["datasets: []"]),
             "tags:",
             *[f"  - {t}" for t in tags], "---", "", f"# {name}", "",
             f"A SpecDiff discrete-diffusion drafter for [{base_model}](https://huggingface.co/{base_model}): pass it as "
             "`assistant_model` (or to `hf_specdiff.generate`) and the verifier checks its drafts, so the output stays "
             "exactly the verifier's (greedy: identical tokens in fp32; sampling: the same distribution). How much "
             "faster it is: see the benchmark below.", "",
             *_kind_lines(config), "", "## Usage", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             f'verifier = AutoModelForCausalLM.from_pretrained("{base_model}")',
             f'tokenizer = AutoTokenizer.from_pretrained("{base_model}")',
             f'drafter = AutoModelForCausalLM.from_pretrained("<org>/{name}", trust_remote_code=True)',
             'inputs = tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}], add_generation_prompt=True,',
             '                                       return_tensors="pt", return_dict=True)',
             f"out = verifier.generate(**inputs, assistant_model={assistant}, max_new_tokens=256)",
             *(["drafter.detach()  # removes the hooks that record the verifier's hidden states"] if layers else []),
             "# SpecDiff-2 self-selection (K drafts and prompt-lookup drafts verified as one tree):",
             "# pip install hf_specdiff, then",
             "# out = hf_specdiff.generate(verifier, drafter, **inputs, num_drafts=4, lookup_tokens=10)",
             *(_DFLASH_USAGE if dflash else []), "```", ""]
    benches = [("Benchmark", bench)] if isinstance(bench, dict) else list(bench or [])
    for title, run in benches:
        settings = run.get("settings", {})
        legend = (f"sampling at temperature {settings['temperature']}, top-p {settings.get('top_p', 1.0)}, every "
                  "method of a prompt from the same seed" if settings.get("temperature") else
                  "exact = share of outputs identical to plain greedy")
        lines += [f"## {title}", "", "Spec-Bench, speed-up over plain `generate` (tau = tokens per verifier forward; "
                  f"{legend}):", "", markdown_table(run), ""]
        if settings:
            lines += [f"Settings: {', '.join(f'{k}={v}' for k, v in settings.items() if k not in ('out',))}.", ""]
    if recipe is not None:
        lines += ["## Training recipe", "", *_recipe_lines(recipe)]
    if reproduce:
        lines += ["## Reproduce", "", "```bash", reproduce, "```", ""]
    return "\n".join(lines)


_DFLASH_USAGE = [
    "# transformers' own DFlash loop, on this folder as it is:",
    '# out = verifier.generate(**inputs, assistant_model=drafter, speculation_type="dflash", max_new_tokens=256)',
    "# exports that need no remote code: transformers' muse_glimmer_assistant, and z-lab's layout (vLLM, SGLang):",
    "# hf-specdiff export THIS_FOLDER OUT --format transformers   # or --format dflash"]


def _kind_lines(config: dict) -> list[str]:
    """The card's description of a drafter: its kind, body and draft vocabulary."""
    layers, dflash = config.get("verifier_layer_ids"), config.get("layout") == "dflash"
    if dflash:
        kind = (f"dflash layout: reads the verifier's hidden states at layers {layers} (fused by one projection) and "
                "drafts with the verifier's own embeddings and head, which it does not store: it runs only with "
                "the verifier attached")
    elif layers:
        kind = (f"conditioned: reads the verifier's hidden states at layers {layers} (fused by one projection; the "
                "draft block attends to them) besides the last committed token")
    else:
        kind = "standalone: drafts from the committed tokens alone"
    vocabulary = len(config["draft_token_ids"]) if config.get("draft_token_ids") else "full"
    block = config["block_size"]
    drafted = f"{block} (the anchor and {block - 1} drafted tokens)" if dflash else f"{block} tokens"
    return [f"- kind: {kind}",
            f"- body: {config['num_hidden_layers']} layers, hidden {config['hidden_size']}, block of {drafted} "
            f"drafted in {config['num_denoising_steps']} denoising step(s)",
            f"- draft vocabulary: {vocabulary} of {config['vocab_size']} tokens (the drafter gives 0 probability to "
            "the rest; decoding stays lossless)"]


def _recipe_lines(recipe: dict) -> list[str]:
    """A training run described, after the run it started from (`init_recipe`) if it trained a drafter further."""
    cfg, data = recipe["config"], recipe["data"]
    lines = _recipe_lines(recipe["init_recipe"]) if "init_recipe" in recipe else []
    lines += [f"{'Then trained further' if lines else 'Trained'} with `hf_specdiff` ({cfg['objective']} objective, kind "
              f"{cfg.get('kind', 'diffusion')}) for {recipe['steps']} steps in {recipe['wall_time_s'] / 60:.1f} min on "
              f"{recipe['machine']}, on {_trajectories(data)}.", "", "```json", json.dumps(cfg, indent=2), "```", ""]
    return lines


def _trajectories(data: dict) -> str:
    """What a run trained on: '1092 verifier greedy trajectories', or the mix of its data folders."""
    sources = data.get("sources") or [{"rows": data["train_rows"], "settings": data["settings"]}]
    kinds = ["greedy" if s["settings"]["temperature"] == 0 else "sampled" for s in sources]
    temperatures = [f" (temperature {s['settings']['temperature']})" if kind == "sampled" else ""
                    for s, kind in zip(sources, kinds)]
    if len(sources) == 1:
        return f"{data['train_rows']} verifier {kinds[0]} trajectories{temperatures[0]}"
    mix = ", ".join(f"{s['rows']} {kind}{t}" for s, kind, t in zip(sources, kinds, temperatures))
    return f"{data['train_rows']} verifier trajectories drawn from {mix} (held-out rows included)"


def package_drafter(drafter_dir, out, dtype=None) -> Path:
    """Write the drafter saved in `drafter_dir` (a training run's folder) to folder `out` in `dtype` (a torch dtype;
    None: as saved), with its remote code and training recipe: the Hub folder that `hf-specdiff card` then renders
    a model card into. A card and benchmarks already in `out` stay."""
    import shutil

    from ..modeling_specdiff import SpecDiffDrafter

    if Path(drafter_dir).resolve() == Path(out).resolve():
        raise ValueError(f"{out} is the drafter's own folder: package it into another one")
    drafter = SpecDiffDrafter.from_pretrained(drafter_dir, dtype=dtype or "auto")
    drafter.save_pretrained(out)
    recipe = Path(drafter_dir) / "training_recipe.json"
    if recipe.is_file():
        shutil.copy(recipe, Path(out) / recipe.name)
    return Path(out)


def validate_model_folder(folder) -> list[str]:
    """What keeps a drafter folder from being Hub-ready (an empty list when it is)."""
    folder = Path(folder)
    problems = [f"missing {name}" for name in REQUIRED_FILES if not (folder / name).exists()]
    if (folder / "config.json").exists():
        config = json.loads((folder / "config.json").read_text())
        if config.get("model_type") != "specdiff":
            problems.append(f"config.json: model_type is {config.get('model_type')!r}, not 'specdiff'")
        if "AutoModelForCausalLM" not in config.get("auto_map", {}):
            problems.append("config.json: no auto_map for AutoModelForCausalLM (save with hf_specdiff imported)")
    if (folder / "generation_config.json").exists():
        generation = json.loads((folder / "generation_config.json").read_text())
        if generation.get("assistant_confidence_threshold") != 0.0:
            problems.append("generation_config.json: assistant_confidence_threshold must be 0")
        if not generation.get("num_assistant_tokens"):
            problems.append("generation_config.json: num_assistant_tokens is not set")
    weights = folder / "model.safetensors"
    if weights.exists() and weights.stat().st_size > MAX_WEIGHTS_MB * 2**20:
        problems.append(f"model.safetensors is {weights.stat().st_size / 2**20:.1f} MB (> {MAX_WEIGHTS_MB} MB)")
    readme = folder / "README.md"
    if readme.exists():
        text = readme.read_text()
        header = text.split("---")[1] if text.startswith("---") and text.count("---") >= 2 else ""
        problems += [f"README.md: metadata lacks {key}" for key in CARD_KEYS if f"{key}:" not in header]
    return problems


def push(folder, repo_id: str, dry_run: bool = False, token: str | None = None) -> list[str]:
    """Upload a validated drafter folder to the Hub (`dry_run`: only list what would be uploaded)."""
    folder = Path(folder)
    problems = validate_model_folder(folder)
    if problems:
        raise ValueError(f"{folder} is not ready to push: " + "; ".join(problems))
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                   if p.is_file() and "checkpoint" not in p.relative_to(folder).parts[0] and "__pycache__" not in p.parts)
    if not dry_run:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, allow_patterns=files)
    return files
