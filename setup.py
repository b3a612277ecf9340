"""Only here to put the suites and the committed golden bundles into the wheel.

pyproject.toml holds the metadata. The suites (suites/) and the bundles (golden/tiny-dsv3, and
golden/tiny-qwen3moe, the one llama.cpp captures on) live at the top of the checkout, where
`pip install -e .` and a plain `pytest suites` use them; a wheel copies them into the package as
harness/_bundled/{suites,golden/<name>}, where
harness.golden.paths finds them when no checkout is around (issue #35: an installed package must run
the suite outside the repository).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness.reports.certificate import git_state  # noqa: E402  (stdlib-only module)

BUNDLED = ("suites", "golden/tiny-dsv3", "golden/tiny-qwen3moe")


class BuildPyWithSuites(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them from the checkout itself
        for rel in BUNDLED:
            src, dst = ROOT / rel, Path(self.build_lib) / "harness" / "_bundled" / rel
            if not src.is_dir():
                raise SystemExit(f"{src} is missing: build the wheel from a full checkout")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
                "__pycache__", "*.pyc", ".*"))
        info = Path(self.build_lib) / "harness" / "_bundled" / "build_info.json"
        info.write_text(json.dumps(git_state(ROOT)) + "\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithSuites})
