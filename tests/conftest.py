"""Unit tests run on tiny models: one intra-op thread avoids oversubscribing 2-core CI."""

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# The unit tests run under `pytest -n 2` (scripts/test.sh). A suite run or CLI call a test
# starts in a subprocess is a run of its own, not an xdist worker: with the worker's variables
# inherited it would believe it is one (its throughput checks skip as under xdist, and
# pytest-benchmark warns on stderr, which broke the one-error-line contract of a bad-input test).
# The worker itself knows it is one from its config (`workerinput`), not from these.
for _var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def smoke_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `--size smoke` bundle (every build stage on a sliver of data, ~15 s), built once per
    session for the tests that must tamper with a bundle or run the suite on one quickly."""
    from harness.golden.builder import BUILD_SIZES, build_bundle

    return build_bundle(tmp_path_factory.mktemp("smoke") / "smoke", seed=0,
                        size=BUILD_SIZES["smoke"], log=lambda _line: None)


@pytest.fixture(scope="module")
def qwen_on_llamacpp():
    """golden/tiny-qwen3moe for tests that serve it with llama.cpp: skipped, saying why, where
    llama.cpp is not built here; its shared llama.cpp workers stopped after the module."""
    from harness.engines.llamacpp import missing_build, shutdown
    from harness.golden.bundle import load_bundle
    from harness.golden.paths import committed_bundle_path

    why = missing_build()
    if why is not None:
        print(f"llama.cpp unavailable: {why}")
        pytest.skip(why)
    yield load_bundle(committed_bundle_path("tiny-qwen3moe"))
    shutdown()
