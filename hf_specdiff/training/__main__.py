"""`python -m hf_specdiff.training ...` / `accelerate launch -m hf_specdiff.training ...`: the `hf-specdiff train` command."""

import sys

from ..tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
