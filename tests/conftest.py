"""Unit tests run on tiny models: one intra-op thread avoids oversubscribing 2-core CI."""

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smoke_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `--size smoke` bundle (every build stage on a sliver of data, ~15 s), built once per
    session for the tests that must tamper with a bundle or run the suite on one quickly."""
    from harness.golden.builder import BUILD_SIZES, build_bundle

    return build_bundle(tmp_path_factory.mktemp("smoke") / "smoke", seed=0,
                        size=BUILD_SIZES["smoke"], log=lambda _line: None)
