"""What users run around the drafter: the `hf-specdiff` command (`cli`), `demo`, `doctor`, `bench`, the verifiers it
loads (`verifiers`), the shipped drafters (`shipped`), Hub cards and folders (`hub`) and engine exports (`export`).
Nothing here ships as remote code."""
