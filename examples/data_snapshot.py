"""Keep a data run's token ids in the repository, so that a lost work tree loses no generation time.

    python examples/data_snapshot.py save runs/smollm2_v3 datasets/smollm2-v3      # after (part of) a data run
    python examples/data_snapshot.py restore datasets/smollm2-v3 runs/smollm2_v3   # before resuming it elsewhere

`save` gzips every .jsonl/.json file of the run folder (prompts, rows, meta, stats; not the feature caches, which
`train --feature-cache` recomputes, nor trained drafters) into the snapshot folder, byte-for-byte reproducible so
that an unchanged file makes no new git object. `restore` unpacks each file whose copy in the run folder is missing
or holds fewer lines: a resumed `distill-data` then generates only the rows the snapshot lacks.
"""

import argparse
import gzip
import shutil
from pathlib import Path

KEPT = (".jsonl", ".json")


def _run_files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in KEPT
                  and not any(part.startswith(("features-", "verifier-top-")) or part == "drafters" for part in p.parts))


def save(run: Path, snapshot: Path):
    files = _run_files(run)
    if not files:
        raise SystemExit(f"{run} holds no .jsonl/.json files to keep")
    for path in files:
        target = snapshot / path.relative_to(run).with_name(path.name + ".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        with path.open("rb") as src, open(tmp, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(target)
        print(f"{path} -> {target} ({target.stat().st_size / 1e6:.1f} MB)")


def _lines(path: Path, opener=open) -> int:
    with opener(path, "rb") as f:
        return sum(1 for _ in f)


def restore(snapshot: Path, run: Path):
    for packed in sorted(snapshot.rglob("*.gz")):
        target = run / packed.relative_to(snapshot).with_suffix("")
        if target.exists() and _lines(target) >= _lines(packed, gzip.open):
            print(f"{target}: kept (as long as the snapshot)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(packed, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        print(f"{packed} -> {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    (save if args.action == "save" else restore)(args.source, args.dest)
