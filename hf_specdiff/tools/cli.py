"""The `hf-specdiff` command."""

import argparse
import sys
import traceback
from pathlib import Path

import torch

TRAINED = "pass the folder that `hf-specdiff train --out` or `hf-specdiff package` wrote"
PACKAGED = "pass the folder that `hf-specdiff package` wrote"


def checked_folder(path, what: str, fix: str, holds: str = "config.json") -> Path:
    """`path` if it is a folder holding the file `holds`; else a one-line error saying there is no `what` there, why,
    and `fix`. Commands call it before loading any model."""
    path = Path(path)
    problem = "no such folder" if not path.exists() else "not a folder" if not path.is_dir() else \
        None if (path / holds).is_file() else f"it has no {holds}"
    if problem:
        raise FileNotFoundError(f"no {what} at {path} ({problem}): {fix}")
    return path


def checked_file(path, what: str, fix: str) -> Path:
    """`path` if it is a file; else a one-line error saying there is no `what` there, why, and `fix`."""
    path = Path(path)
    if not path.is_file():
        problem = "a folder, not a file" if path.is_dir() else "no such file"
        raise FileNotFoundError(f"no {what} at {path} ({problem}): {fix}")
    return path


def checked_verifier(name: str) -> str:
    """`name` if it is a known verifier name or a model folder; else a one-line error listing the known names."""
    from .verifiers import KNOWN_VERIFIERS

    if name not in KNOWN_VERIFIERS:
        checked_folder(name, "verifier folder", f"pass a known verifier name ({', '.join(sorted(KNOWN_VERIFIERS))}) "
                                                "or a model folder with a config.json")
    return name


def _add_train_arguments(parser: argparse.ArgumentParser):
    from ..training.trainer import config_fields

    for name, kind, default, help_text in config_fields():
        flag = "--" + name.replace("_", "-")
        if default is None:
            parser.add_argument(flag, required=True, help=help_text)
        else:
            parser.add_argument(flag, type=_yes_no if isinstance(default, bool) else type(default), default=default,
                                help=f"{help_text} (default: {default})".strip())


def _yes_no(text: str) -> bool:
    if text.lower() not in ("true", "false", "yes", "no", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "yes", "1")


def _train_config(args):
    from ..training.trainer import TrainConfig, config_fields

    return TrainConfig(**{name: getattr(args, name) for name, *_ in config_fields()})


def cmd_setup(args):
    from .verifiers import KNOWN_VERIFIERS, prepare_verifier

    name = checked_verifier(args.verifier)
    print(prepare_verifier(name) if name in KNOWN_VERIFIERS else name)  # a model folder needs no conversion


def cmd_distill_data(args):
    from ..compat import verifier_layer_ids
    from ..training.data import DistillDataConfig, make_distill_data, read_prompts
    from .verifiers import load_verifier

    checked_verifier(args.verifier)
    prompts = read_prompts(args.prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    verifier, tokenizer = load_verifier(args.verifier, dtype=_dtype(args.dtype), device=args.device)
    config = DistillDataConfig(samples_per_prompt=args.samples_per_prompt, temperature=args.temperature,
                               top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
    make_distill_data(verifier, tokenizer, prompts, args.out, config, batch_size=args.batch_size,
                      verifier_name=args.verifier, max_samples=args.max_samples or None,
                      verifier_layer_ids=verifier_layer_ids(args.verifier_layers, verifier))
    print(f"data in {args.out}")


def cmd_synth_prompts(args):
    from ..training.magpie import synthesize_prompts
    from .verifiers import load_verifier

    verifier, tokenizer = load_verifier(checked_verifier(args.verifier), dtype=_dtype(args.dtype), device=args.device)
    synthesize_prompts(verifier, tokenizer, args.num_prompts, args.out, batch_size=args.batch_size,
                       temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                       seed=args.seed)
    print(f"prompts in {args.out}")


def cmd_train(args):
    from ..training.trainer import train

    checked_verifier(args.verifier)
    for folder in filter(None, (part.strip() for part in args.data.split(","))):
        checked_folder(folder, "distillation data folder", "make one with `hf-specdiff distill-data --out`",
                       holds="meta.json")
    print(f"drafter in {train(_train_config(args))}")


def cmd_eval_drafter(args):
    from ..training.data import read_prompts
    from ..training.evaluate import evaluate_drafter, format_report, save_report
    from ..modeling_specdiff import SpecDiffDrafter
    from .verifiers import load_verifier

    checked_folder(args.drafter, "drafter folder", TRAINED)
    prompts = read_prompts(args.prompts)[: args.limit or None]
    verifier, tokenizer = load_verifier(checked_verifier(args.verifier), dtype=_dtype(args.dtype), device=args.device)
    drafter = SpecDiffDrafter.from_pretrained(args.drafter, dtype=verifier.dtype).to(verifier.device).eval()
    report = evaluate_drafter(verifier, tokenizer, drafter, prompts, num_drafts=args.num_drafts,
                              draft_length=args.draft_length, num_denoising_steps=args.steps,
                              max_new_tokens=args.max_new_tokens)
    print(format_report(report))
    if args.out:
        save_report(report, args.out)


def cmd_demo(args):
    from .demo import run_demo

    if args.drafter:
        checked_folder(args.drafter, "drafter folder", f"{TRAINED}, or leave --drafter out for the shipped drafter")
    checked_verifier(args.verifier)
    prompts = list(args.prompt)
    if args.prompt_file:
        from ..training.data import read_prompts

        path = Path(args.prompt_file)
        if not path.is_file():
            raise FileNotFoundError(f"no prompt file at {path}")
        prompts += read_prompts(path) if path.suffix == ".jsonl" else \
            [line.strip() for line in path.read_text().splitlines() if line.strip()]
    run_demo(prompts or None, verifier=args.verifier, drafter=args.drafter, num_drafts=args.num_drafts,
             lookup_tokens=args.lookup_tokens, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
             threads=args.threads)


def cmd_doctor(args):
    from .doctor import DTYPES, measure_outlooks, report

    if args.drafter:
        checked_folder(args.drafter, "drafter folder", f"{TRAINED}, or leave --drafter out for the shipped drafter")
    checked_verifier(args.verifier)
    dtypes = tuple(DTYPES) if args.dtype == "auto" else (args.dtype,)
    print(report(measure_outlooks(args.verifier, args.drafter, dtypes, threads=args.threads, device=args.device,
                                  fresh=args.measure)))


def cmd_bench(args):
    from transformers import AutoModelForCausalLM

    from .bench import benchmark, by_kind, markdown_table, read_spec_bench, save
    from ..decoding import DEFAULT_NUM_LOOKUP_DRAFTS
    from .shipped import SHIPPED_DRAFTERS, shipped_drafter_path
    from .verifiers import load_verifier

    prompts = read_spec_bench(args.prompts, args.per_category)  # bad arguments fail before any model loads
    sampling = _sampling(args)
    _check_bench_models(args)
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    run_info = {k: settings[k] for k in ("verifier", "drafter", "compare_drafter", "mdlm_drafter", "ar_drafter",
                                         "dtype", "drafter_dtype", "threads")}
    drafter = args.drafter or (shipped_drafter_path(args.verifier) if args.verifier in SHIPPED_DRAFTERS else None)
    if args.dtype == "auto":
        from .doctor import choose_dtype

        args.dtype = run_info["dtype"] = settings["dtype"] = choose_dtype(args.verifier, drafter, args.threads,
                                                                          args.device)
    verifier, tokenizer = load_verifier(args.verifier, dtype=_dtype(args.dtype), device=args.device)
    drafter_dtype = verifier.dtype if args.drafter_dtype == "same" else _dtype(args.drafter_dtype)

    def load(path):
        if not path:
            return None
        return AutoModelForCausalLM.from_pretrained(path, dtype=drafter_dtype, trust_remote_code=True) \
            .to(verifier.device).eval()

    specdiff = [d for d in (load(drafter), load(args.compare_drafter)) if d is not None]
    summary = benchmark(verifier, tokenizer, prompts, **by_kind(specdiff), mdlm_drafter=load(args.mdlm_drafter),
                        ar_drafter=load(args.ar_drafter), num_drafts=tuple(int(k) for k in args.num_drafts.split(",")),
                        max_new_tokens=args.max_new_tokens, with_lookup=args.with_lookup, only=args.method,
                        lookup_drafts=tuple(int(n) for n in args.num_lookup_drafts.split(","))
                        if args.num_lookup_drafts else (DEFAULT_NUM_LOOKUP_DRAFTS,),
                        records_file=Path(args.out) / "records.jsonl", run_info=run_info, threads=args.threads,
                        repeats=args.repeats, sampling=sampling)
    summary["settings"] = settings
    print(markdown_table(summary))
    save(summary, args.out)


def _check_bench_models(args):
    checked_verifier(args.verifier)
    for path, what, fix in (
            (args.drafter, "drafter folder", f"{TRAINED}, or leave --drafter out for the shipped drafter"),
            (args.compare_drafter, "drafter folder", TRAINED),
            (args.mdlm_drafter, "mdlm drafter folder", "pass the folder that `hf-specdiff train --objective mdlm "
                                                       "--out` wrote"),
            (args.ar_drafter, "autoregressive drafter folder", "pass a model folder, e.g. the one that `hf-specdiff "
                                                               "train --kind ar --out` wrote")):
        if path:
            checked_folder(path, what, fix)


def _sampling(args) -> dict | None:
    """bench's sampling options from --temperature/--top-p/--top-k (None: greedy)."""
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        raise ValueError("--temperature must be >= 0, --top-p in (0, 1] and --top-k >= 0")
    if args.temperature == 0:
        if args.top_p != 1.0 or args.top_k:
            raise ValueError("--top-p and --top-k take effect only when sampling: pass --temperature > 0 too")
        return None
    return {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k or None}


def cmd_card(args):
    import json

    from .hub import render_card, validate_model_folder

    checked_folder(args.folder, "drafter folder", PACKAGED)
    bench_files = [checked_file(path, "bench results", "pass the results.json that `hf-specdiff bench --out` wrote")
                   for path in args.bench or []]
    bench = [(_bench_title(path), json.loads(path.read_text())) for path in bench_files]
    recipe_path = Path(args.folder) / "training_recipe.json"
    if args.recipe:
        recipe_path = checked_file(args.recipe, "training recipe", "pass the training_recipe.json that `hf-specdiff "
                                   "train --out` wrote, or leave --recipe out for the folder's own")
    recipe = json.loads(recipe_path.read_text()) if recipe_path.exists() else None
    card = render_card(args.folder, args.base_model, bench=bench, recipe=recipe, datasets=tuple(args.dataset or ()),
                       reproduce=args.reproduce)
    (Path(args.folder) / "README.md").write_text(card)
    problems = validate_model_folder(args.folder)
    for problem in problems:
        print(f"not ready: {problem}")
    if problems:
        raise ValueError(f"{args.folder} is not Hub-ready ({len(problems)} problem(s))")
    print(f"{args.folder} is Hub-ready")


def _bench_title(path: str) -> str:
    """A card section title for a bench results.json: "Benchmark", or "Benchmark: <name>" for a folder bench-<name>."""
    name = Path(path).resolve().parent.name
    return "Benchmark" + (f": {name.removeprefix('bench-')}" if name.startswith("bench-") else "")


def cmd_push(args):
    from .hub import push

    checked_folder(args.folder, "drafter folder", f"{PACKAGED} and `hf-specdiff card` validated")
    files = push(args.folder, args.repo, dry_run=args.dry_run)
    print(("would upload" if args.dry_run else "uploaded") + f" to {args.repo}:")
    for name in files:
        print(f"  {name}")


def cmd_export_custom_generate(args):
    from .hub import export_custom_generate

    print(export_custom_generate(args.out))


def cmd_package(args):
    from .hub import package_drafter

    checked_folder(args.drafter, "drafter folder", "pass the folder that `hf-specdiff train --out` wrote")
    print(package_drafter(args.drafter, args.out, None if args.dtype == "same" else _dtype(args.dtype)))


def cmd_export(args):
    from .export import export_drafter
    from ..modeling_specdiff import SpecDiffDrafter

    checked_folder(args.drafter, "drafter folder", "pass the folder of a dflash-layout drafter, as `hf-specdiff train "
                                                   "--layout dflash --verifier-layers auto --out` writes it")
    drafter = SpecDiffDrafter.from_pretrained(args.drafter)
    print(export_drafter(drafter, args.out, args.format))


def _dtype(name: str):
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[name]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-specdiff", description="Speculative decoding with diffusion drafters")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in (_setup_parser, _demo_parser, _doctor_parser, _distill_data_parser, _synth_prompts_parser, _train_parser,
                       _eval_drafter_parser, _bench_parser, _package_parser, _card_parser, _push_parser,
                       _export_parser, _export_custom_generate_parser):
        add_parser(sub)
    return parser


def _setup_parser(sub):
    p = sub.add_parser("setup", help="convert a registry-shipped verifier to a cached safetensors folder, and print "
                                     "the folder")
    p.add_argument("--verifier", default="smollm2-135m-instruct",
                   help="a known verifier name (a model folder needs no setup: printed as it is)")
    p.set_defaults(func=cmd_setup)


def _demo_parser(sub):
    p = sub.add_parser("demo", help="stream an answer with SpecDiff, then compare speed and text with plain greedy")
    p.add_argument("prompt", nargs="*", help="one or more prompts (default: four of different kinds: a code edit, an "
                                              "extraction, a summary, an open question)")
    p.add_argument("--prompt-file", default=None, help="more prompts: a text file, one per line, or a jsonl file")
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the shipped SmolLM2 drafter)")
    p.add_argument("--num-drafts", type=int, default=4, help="K drafts verified as one tree")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt-lookup branch in the tree (0: none)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto: the dtype the method is fastest in on this machine's cost profile")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_demo)


def _doctor_parser(sub):
    p = sub.add_parser("doctor", help="this machine's cost profile: what drafting can gain here, what the defaults "
                                      "will do and why")
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the shipped SmolLM2 drafter)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="auto: both, compared")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    p.add_argument("--measure", action="store_true", help="time the forwards again and keep the new profile in place "
                   "of the kept one (after a change to the machine, or where it was busy the first time)")
    p.set_defaults(func=cmd_doctor)


def _distill_data_parser(sub):
    p = sub.add_parser("distill-data", help="sample verifier trajectories on training prompts (resumable)")
    p.add_argument("--verifier", required=True, help="verifier folder or known name")
    p.add_argument("--prompts", required=True, help="jsonl prompt file")
    p.add_argument("--out", required=True)
    p.add_argument("--samples-per-prompt", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.7, help="0: the verifier's greedy responses")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    p.add_argument("--max-samples", type=int, default=0,
                   help="stop after N samples (shortest prompts first); a later run with a larger N extends the data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verifier-layers", default="",
                   help="also keep the verifier's hidden states after these layers ('auto' or a list, as `train "
                        "--verifier-layers`), read while generating: the feature cache `train --feature-cache` "
                        "reads, with no teacher forward over the data")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    p.add_argument("--device", default=None)
    p.set_defaults(func=cmd_distill_data)


def _synth_prompts_parser(sub):
    p = sub.add_parser("synth-prompts", help="user requests written by the verifier itself (Magpie; resumable)")
    p.add_argument("--verifier", required=True, help="verifier folder or known name")
    p.add_argument("--num-prompts", type=int, required=True, help="stop when the file holds this many")
    p.add_argument("--out", required=True, help="jsonl file (appended to; <out>.meta.json records the run)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16"])
    p.add_argument("--device", default=None)
    p.set_defaults(func=cmd_synth_prompts)


def _train_parser(sub):
    p = sub.add_parser("train", help="train a drafter (also: accelerate launch -m hf_specdiff.training)")
    _add_train_arguments(p)
    p.set_defaults(func=cmd_train)


def _eval_drafter_parser(sub):
    p = sub.add_parser("eval-drafter", help="tau and acceptance by position on held-out prompts")
    p.add_argument("--verifier", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--num-drafts", type=int, default=1)
    p.add_argument("--draft-length", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="denoising steps T (default: the drafter's)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="fp32", choices=["bf16", "fp32", "fp16"])
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None, help="folder for eval.json, eval.md and the PNG plot")
    p.set_defaults(func=cmd_eval_drafter)


def _bench_parser(sub):
    p = sub.add_parser("bench", help="Spec-Bench: every method side by side, interleaved per prompt")
    p.add_argument("--prompts", required=True, help="Spec-Bench question.jsonl (or any jsonl with category + turns)")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=None, help="the aligned SpecDiff drafter (default: the shipped one)")
    p.add_argument("--compare-drafter", default=None,
                   help="an aligned SpecDiff drafter of another kind than --drafter (standalone, conditioned on the "
                        "verifier's hidden states, or of the dflash layout), benchmarked beside it")
    p.add_argument("--mdlm-drafter", default=None, help="an unaligned (mdlm) SpecDiff drafter")
    p.add_argument("--ar-drafter", default=None, help="an autoregressive drafter for transformers' assistant path")
    p.add_argument("--num-drafts", default="1,4", help="comma-separated K values for SpecDiff-2")
    p.add_argument("--with-lookup", action="store_true",
                   help="also run each SpecDiff-2 method with a prompt-lookup branch in its tree (+ lookup)")
    p.add_argument("--num-lookup-drafts", default=None,
                   help="comma-separated counts of lookup drafts in the + lookup methods' trees (default: the "
                        "library's; another count is named + lookup xN)")
    p.add_argument("--method", action="append", default=None,
                   help="run only this method (repeatable; plain always runs), e.g. --method 'prompt lookup'; "
                        "--method 'plain again' runs plain once more, the run's noise floor")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=1,
                   help="run each prompt this many times through every method (order reversed every other time) and "
                        "keep each method's fastest run: less timing noise on a shared machine")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy (default); > 0: sample at this temperature, every method of a prompt from the "
                        "same seed (no exact-match rate: sampled texts differ)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's top-p, with --temperature")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling (0: off), with --temperature")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="auto: the dtype the shipped method is fastest in on this machine's cost profile")
    p.add_argument("--drafter-dtype", default="same", choices=["same", "bf16", "fp32"],
                   help="the drafters' dtype (same: the verifier's); an fp32 drafter beside a bf16 verifier drafts "
                        "faster on CPUs without bf16 matrix units (docs/tuning.md)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="results",
                   help="results folder; its records.jsonl keeps each finished prompt, and a rerun resumes from it")
    p.set_defaults(func=cmd_bench)


def _package_parser(sub):
    p = sub.add_parser("package", help="write a trained drafter as a Hub folder (weights in a dtype, remote code, "
                                       "recipe), for `card` to render its model card into")
    p.add_argument("drafter", help="the drafter's folder (hf-specdiff train --out)")
    p.add_argument("out")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32", "fp16", "same"],
                   help="the weights' dtype (same: as saved; training saves fp32)")
    p.set_defaults(func=cmd_package)


def _card_parser(sub):
    p = sub.add_parser("card", help="render a drafter folder's model card and validate the folder")
    p.add_argument("folder")
    p.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    p.add_argument("--bench", action="append", default=None,
                   help="results.json from hf-specdiff bench (repeatable: one section each, titled by its folder)")
    p.add_argument("--recipe", default=None, help="training_recipe.json (default: the folder's)")
    p.add_argument("--dataset", action="append", default=None,
                   help="Hub id of a dataset the training prompts came from (repeatable; none: `datasets: []`)")
    p.add_argument("--reproduce", default=None, help="the commands that reproduce the drafter and its results")
    p.set_defaults(func=cmd_card)


def _push_parser(sub):
    p = sub.add_parser("push", help="upload a validated drafter folder to the Hub")
    p.add_argument("folder")
    p.add_argument("--repo", required=True, help="org/name")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded, upload nothing")
    p.set_defaults(func=cmd_push)


def _export_parser(sub):
    p = sub.add_parser("export", help="write a dflash-layout drafter for transformers' DFlash loop or vLLM/SGLang")
    p.add_argument("drafter", help="drafter folder (layout dflash)")
    p.add_argument("out")
    p.add_argument("--format", required=True, choices=["transformers", "dflash"],
                   help="transformers: its muse_glimmer_assistant model (speculation_type='dflash', no remote code); "
                        "dflash: z-lab's layout, as vLLM and SGLang load it")
    p.set_defaults(func=cmd_export)


def _export_custom_generate_parser(sub):
    p = sub.add_parser("export-custom-generate", help="write the Hub custom_generate folder")
    p.add_argument("out")
    p.set_defaults(func=cmd_export_custom_generate)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, ImportError) as error:
        if not _raised_here(error):
            raise  # a failure inside torch or transformers: its whole traceback
        print(f"hf-specdiff {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


def _raised_here(error: BaseException) -> bool:
    """Whether hf_specdiff raised `error` itself (its innermost Python frame is in this package): an error that
    names its fix, shown as one line."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(Path(__file__).resolve().parents[1])


if __name__ == "__main__":
    sys.exit(main())
