"""Fixtures the checks share beyond the plugin's (`bundle`, `draft_name`, `engine`, `report`)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from harness.engines.base import Engine, Generation
from harness.golden.bundle import Bundle, DraftSpec
from harness.golden.oracle import Oracle

# The models are tiny: one intra-op thread is as fast as two when the machine is idle and
# 10-40x faster when it is not (thread oversubscription on 2-core CI machines).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def oracle(bundle: Bundle) -> Oracle:
    return Oracle(bundle)


@pytest.fixture
def spec(bundle: Bundle, draft_name: str) -> DraftSpec:
    return bundle.draft(draft_name)



@pytest.fixture
def generate() -> Callable[[Engine, Sequence[Sequence[int]], int, bool], Generation]:
    """Greedy generation memoised on the engine instance: acceptance, vocabulary and
    losslessness checks judge the same run instead of paying for it three times (and a new
    engine for the next draft starts with an empty memo)."""

    def run(engine: Engine, prompts: Sequence[Sequence[int]], max_new_tokens: int,
            speculative: bool) -> Generation:
        memo: dict = engine.__dict__.setdefault("_suite_generations", {})
        key = (tuple(tuple(p) for p in prompts), speculative, max_new_tokens)
        if key not in memo:
            memo[key] = engine.generate(prompts, max_new_tokens, speculative)
        return memo[key]

    return run


def _gpu_info() -> dict[str, Any]:
    """GPU name, driver and CUDA runtime where there is one: a baseline is only comparable on
    the same machine class, so the stored run must say which it was."""
    if not torch.cuda.is_available():
        return {"gpu": None}
    info: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "cuda_runtime": torch.version.cuda}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
        info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        info["driver"] = None
    return info


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """pytest-benchmark's machine record, plus what decides whether two runs compare: the
    GPU and its driver, the engine under test, its dtype and device, torch."""
    machine_info["eagle3_conformance"] = {
        "engine": config.getoption("engine"), "dtype": config.getoption("dtype"),
        "device": config.getoption("device"), "torch": torch.__version__, **_gpu_info()}
