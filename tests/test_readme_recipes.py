"""Recipes the docs give as code run as written (the doctor's page, docs/DOCTOR.md, since the
README was cut to its essentials) (issue #35: its sample_batch recipe passed an
int where the function takes a torch.Generator, and raised TypeError)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from harness.golden.corpus import manifest_language, sample_batch
from harness.golden.paths import default_bundle_path

ROOT = Path(__file__).resolve().parents[1]


def test_sample_batch_recipe_runs_and_matches_the_doctor_tests() -> None:
    readme = (ROOT / "docs" / "DOCTOR.md").read_text()
    (recipe,) = re.findall(r"`(sample_batch\(manifest_language\(manifest\)[^`]*)`", readme)
    manifest = json.loads((default_bundle_path() / "manifest.json").read_text())
    seed = manifest["seed"]
    prompts = eval(recipe, {"sample_batch": sample_batch, "manifest_language": manifest_language,
                            "torch": torch, "manifest": manifest, "seed": seed})
    assert len(prompts) == 96 and {len(p) for p in prompts} == {24}
    # the same prompts tests/test_doctor.py and tests/test_weight_inference.py build
    same = sample_batch(manifest_language(manifest), 96, 24,
                        torch.Generator().manual_seed(int(manifest["seed"]) + 51)).tolist()
    assert prompts == same
