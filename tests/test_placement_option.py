"""The placement option refuses, in one line naming the fix, what it cannot place: an unknown
placement, a launch of one process, a missing accelerate (harness/models/placement.py). The
placement itself is tests/test_distributed_placement.py's."""

from __future__ import annotations

import importlib.util

import pytest

from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.models.placement import TENSOR_PARALLEL, PlacementError, check_placement, gathered


def test_no_placement_is_the_whole_target_here() -> None:
    check_placement(None)


def test_an_unknown_placement_names_the_known_ones() -> None:
    with pytest.raises(PlacementError) as e:
        check_placement("pipeline")
    assert "tensor-parallel" in str(e.value) and "\n" not in str(e.value)


def test_one_process_is_refused_with_the_launch_that_fixes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("without accelerate the placement is refused for that first (next test)")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(PlacementError, match="torchrun --nproc-per-node"):
        check_placement(TENSOR_PARALLEL)


def test_without_accelerate_the_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(PlacementError, match=r"eagle3-conformance\[distributed\]"):
        check_placement(TENSOR_PARALLEL)


def test_the_reference_engine_refuses_a_placement_it_cannot_make(monkeypatch: pytest.MonkeyPatch) -> None:
    """The option reaches the target's loader: a one-process launch is refused there, before
    transformers is asked for a tensor-parallel plan it would half-build."""
    from golden_oracle import committed_oracle

    bundle = committed_oracle().bundle
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(PlacementError):
        ReferenceEngine(bundle.target_dir, bundle.draft_dir("specforge-default"),
                        EngineOptions(placement=TENSOR_PARALLEL))


def test_a_plain_tensor_is_recorded_as_it_is() -> None:
    import torch

    x = torch.ones(2, 3)
    assert gathered(x) is x
