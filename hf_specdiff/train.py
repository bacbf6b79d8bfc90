"""`python -m hf_specdiff.train ...` / `accelerate launch -m hf_specdiff.train ...`: the `hf-specdiff train` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
