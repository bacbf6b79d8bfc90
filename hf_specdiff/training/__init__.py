"""Making a drafter for a verifier: training data (`data`, `magpie`, `batch_generation`), the verifier's features
(`feature_cache`), the objectives (`objectives`, `block_diffusion`), the trainer (`trainer`) and held-out evaluation
(`evaluate`). `python -m hf_specdiff.training` is `hf-specdiff train`. Nothing here runs at generation time."""
