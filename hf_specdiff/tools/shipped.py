"""Where the drafters that ship with hf_specdiff are: inside the installed package (a wheel), or in the
repository's `model_cards/` (a source checkout or an editable install)."""

from pathlib import Path

SHIPPED_DRAFTERS = {"smollm2-135m-instruct": "specdiff-smollm2-135m-instruct"}  # verifier name -> drafter folder
PACKAGED = Path(__file__).resolve().parents[1] / "drafters"  # hf_specdiff/drafters
CHECKOUT = Path(__file__).resolve().parents[2] / "model_cards"


def shipped_drafter_path(verifier: str = "smollm2-135m-instruct") -> Path:
    """The folder of the drafter shipped for `verifier` (a known verifier name)."""
    if verifier not in SHIPPED_DRAFTERS:
        raise ValueError(f"No drafter ships for {verifier!r} (drafters ship for {sorted(SHIPPED_DRAFTERS)}): "
                         "pass your own with --drafter DIR, or train one with `hf-specdiff train`.")
    places = [root / SHIPPED_DRAFTERS[verifier] for root in (PACKAGED, CHECKOUT)]
    for place in places:
        if (place / "config.json").is_file():
            return place
    raise FileNotFoundError(
        f"The shipped drafter for {verifier} is not installed (looked in {places[0]} and {places[1]}). Install "
        "hf_specdiff from its repository (`pip install .` puts the drafter in the package), or pass --drafter DIR.")
