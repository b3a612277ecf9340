"""Where the suites and the committed golden bundle are: in the source checkout (`pip install
-e .`, or `PYTHONPATH` at a checkout) or, for an installed wheel, inside the package
(harness/_bundled/, copied there by setup.py when the wheel is built)."""

from __future__ import annotations

from pathlib import Path

from harness.golden.bundle import DEFAULT_BUNDLE_NAME

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_ROOT = Path(__file__).resolve().parents[1] / "_bundled"


def _root() -> Path:
    """The checkout when this package is imported from one, else the wheel's copies. A
    checkout is recognised by its suites' conftest.py, never by a bare `suites` folder that
    happens to sit beside site-packages."""
    return REPO_ROOT if (REPO_ROOT / "suites" / "conftest.py").is_file() else BUNDLED_ROOT


def default_bundle_path() -> Path:
    return committed_bundle_path(DEFAULT_BUNDLE_NAME)


def committed_bundle_path(name: str) -> Path:
    """golden/<name> beside the default bundle: the checkout's, or the wheel's copy (setup.py
    bundles every committed bundle, not only the default)."""
    return _root() / "golden" / name


def suites_path() -> Path:
    return _root() / "suites"
