"""The committed bundle's oracle, built once per test process, for the diagnosis tests that
judge engines against it outside a suite run (no plugin fixture: these are unit tests)."""

from __future__ import annotations

from functools import cache

import pytest

from harness.golden.bundle import BundleError, load_bundle
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path


@cache
def committed_oracle() -> Oracle:
    try:
        return Oracle(load_bundle(default_bundle_path(), verify_hashes=False))
    except BundleError as e:
        pytest.skip(f"committed bundle unavailable: {e}")
