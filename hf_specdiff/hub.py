"""Hub-ready folders: the self-selection loop as a `custom_generate` repository."""

import inspect
from pathlib import Path

from . import decoding

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
(default: adapted to measured acceptance), `streamer`, `stats` (a `SpecDiffStats` to fill). Batch size 1.
The verifier needs an attention implementation that takes a 4D mask (`sdpa` or `eager`) when K > 1.

The code is `hf_specdiff/decoding.py` of the hf_specdiff package, which imports only torch and transformers.
"""


def export_custom_generate(path) -> Path:
    """Write a Hub `custom_generate` repository (README + custom_generate/generate.py) to `path`; return it."""
    path = Path(path)
    (path / "custom_generate").mkdir(parents=True, exist_ok=True)
    (path / "custom_generate" / "generate.py").write_text(inspect.getsource(decoding))
    (path / "README.md").write_text(CUSTOM_GENERATE_README)
    return path
