"""Keep a data run's token ids in the repository, so that a lost work tree loses no generation time.

    python recipes/data_snapshot.py save runs/smollm2_v3 datasets/smollm2-v3      # after (part of) a data run
    python recipes/data_snapshot.py restore datasets/smollm2-v3 runs/smollm2_v3   # before resuming it elsewhere

`save` gzips every .jsonl/.json file of the run folder (prompts, rows, meta, stats; not the feature caches, which
`train --feature-cache` recomputes, nor trained drafters) into the snapshot folder, .jsonl files in chunks of 1,000
lines, byte-for-byte reproducible: saving a grown run again rewrites only its last chunks. `restore` unpacks each
file whose copy in the run folder is missing or holds fewer lines: a resumed `distill-data` then generates only the
rows the snapshot lacks.
"""

import argparse
import gzip
import re
from pathlib import Path

KEPT = (".jsonl", ".json")
CHUNK_LINES = 1000  # .jsonl files are kept in chunks of this many lines: a grown file adds a chunk or two, not a copy
CHUNK = re.compile(r"\.(\d{4})$")


def _run_files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and p.suffix in KEPT
                  and not any(part.startswith(("features-", "verifier-top-")) or part == "drafters" for part in p.parts))


def _write_gzip(data: bytes, target: Path):
    target.parent.mkdir(parents=True, exist_ok=True)
    packed = gzip.compress(data, compresslevel=9, mtime=0)
    if not target.exists() or target.read_bytes() != packed:
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(packed)
        tmp.replace(target)


def save(run: Path, snapshot: Path):
    files = _run_files(run)
    if not files:
        raise SystemExit(f"{run} holds no .jsonl/.json files to keep")
    for path in files:
        data, name = path.read_bytes(), snapshot / path.relative_to(run)
        if path.suffix == ".jsonl":
            lines = data.splitlines(keepends=True)
            for number, first in enumerate(range(0, len(lines), CHUNK_LINES)):
                _write_gzip(b"".join(lines[first:first + CHUNK_LINES]), name.with_name(f"{name.name}.{number:04d}.gz"))
        else:
            _write_gzip(data, name.with_name(name.name + ".gz"))
        print(f"{path} -> {name}*.gz")


def _packed_files(snapshot: Path) -> dict[Path, list[Path]]:
    """Each kept file's path relative to the snapshot, with its gzipped pieces in order."""
    pieces: dict[Path, list[Path]] = {}
    for packed in sorted(snapshot.rglob("*.gz")):
        relative = packed.relative_to(snapshot).with_suffix("")
        pieces.setdefault(relative.with_name(CHUNK.sub("", relative.name)), []).append(packed)
    return pieces


def restore(snapshot: Path, run: Path):
    for relative, pieces in _packed_files(snapshot).items():
        data = b"".join(gzip.decompress(piece.read_bytes()) for piece in pieces)
        target = run / relative
        if target.exists() and target.read_bytes().count(b"\n") >= data.count(b"\n"):
            print(f"{target}: kept (as long as the snapshot)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        print(f"{relative} -> {target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    (save if args.action == "save" else restore)(args.source, args.dest)
