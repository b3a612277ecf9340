"""Where the committed artefacts live, for a source checkout (`pip install -e .`)."""

from __future__ import annotations

from pathlib import Path

from harness.golden.bundle import DEFAULT_BUNDLE_NAME

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_bundle_path() -> Path:
    return REPO_ROOT / "golden" / DEFAULT_BUNDLE_NAME


def suites_path() -> Path:
    return REPO_ROOT / "suites"
