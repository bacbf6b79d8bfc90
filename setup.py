"""Build hook: a wheel carries the shipped drafters (their config and weights) inside the package, under
`hf_specdiff/drafters/`, copied from `model_cards/` (the Hub-ready folders, which stay the one copy in git)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ["specdiff-smollm2-135m-instruct"]
FILES = ["config.json", "generation_config.json", "model.safetensors"]


class BuildPyWithDrafters(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install finds them in model_cards/
            return
        for name in SHIPPED:
            target = Path(self.build_lib) / "hf_specdiff" / "drafters" / name
            target.mkdir(parents=True, exist_ok=True)
            for file in FILES:
                shutil.copy2(ROOT / "model_cards" / name / file, target / file)


setup(cmdclass={"build_py": BuildPyWithDrafters})
