"""The reduced-precision capture tolerance is earned, not blanket: a bf16 engine may differ
from the fp32 boundary at a token only where fp32 routing is a near-tie (an expert swap), and
a real wiring bug in bf16 still fails. Prompt [18] is the case an H200 run found: its layer-1
routing margin is 1.7e-3 and bf16 (CUDA, and CPU alike) routes it to another expert, moving
boundary 2 by 12%. Pinned here so the excuse never widens into hiding a bug, nor narrows into
a flaky bf16 verdict."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from harness.assertions import ConformanceFailure, assert_capture_matches
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.paths import default_bundle_path
from harness.tolerances import tolerance_for

DRAFT = "specforge-default"
NEAR_TIE_PROMPT = [18]


@cache
def _oracle() -> Oracle:
    return Oracle(load_bundle(default_bundle_path(), verify_hashes=False))


def _bf16_features(prompt: list[int], draft: str = DRAFT) -> list[torch.Tensor]:
    b = _oracle().bundle
    engine = ReferenceEngine(b.target_dir, b.draft_dir(draft),
                             EngineOptions(dtype="bfloat16", training_convention=b.draft(draft).convention))
    try:
        return engine.capture([prompt]).features
    finally:
        engine.close()


def _check(features: list[torch.Tensor], prompt: list[int], boundaries: tuple[int, ...],
           dtype: str = "bfloat16", margins: bool = True) -> None:
    o = _oracle()
    assert_capture_matches(features=features, golden=[o.features(prompt)], training_boundaries=boundaries,
                           dtype=dtype, engine_name="reference", engine_convention=None,
                           config_ids=o.spec(DRAFT).layer_ids, draft=DRAFT, prompts=[prompt],
                           check="test_capture_tolerance",
                           margins=[o.routing_margins(prompt)] if margins else None)


def test_the_pinned_prompt_is_a_routing_near_tie() -> None:
    margins = _oracle().routing_margins(NEAR_TIE_PROMPT)
    assert margins.shape == (9, 1) and torch.isinf(margins[:2]).all()  # no MoE layer before b=2
    assert float(margins[2, 0]) <= tolerance_for("bfloat16").routing_noise < 0.05


@pytest.mark.parametrize("prompt", [NEAR_TIE_PROMPT, NEAR_TIE_PROMPT + [3]])
def test_bf16_routing_flip_is_excused_only_with_the_margins(prompt: list[int]) -> None:
    """[18, 3]: the flip at token 0 reaches token 1 through attention (the H200 found this
    one too); token 1 is excused because it is still nearest to its trained boundary."""
    boundaries = _oracle().spec(DRAFT).boundaries
    features = _bf16_features(prompt)
    _check(features, prompt, boundaries)  # excused: the margins show the tie
    with pytest.raises(ConformanceFailure, match=rf"differ from training on \d/{len(prompt)} tokens \(worst"):
        _check(features, prompt, boundaries, margins=False)
    with pytest.raises(ConformanceFailure, match=r"per-token relative L2 error <= 0.001 on every token"):
        _check(features, prompt, boundaries, dtype="float32")


def test_a_wiring_bug_in_bf16_is_not_excused() -> None:
    """The same near-tie prompt plus a long one, captured one boundary early (the vLLM offset):
    the tie excuses at most its own token, every other token still fails."""
    o = _oracle()
    prompt = NEAR_TIE_PROMPT + max(o.pinned_prompts, key=len)[1:]
    shifted = tuple(b - 1 for b in o.spec(DRAFT).boundaries)
    features = [torch.cat([o.features(prompt).boundaries[b] for b in shifted], -1).bfloat16().float()]
    with pytest.raises(ConformanceFailure, match=r"root cause: offset -1") as err:
        _check(features, prompt, o.spec(DRAFT).boundaries)
    assert "differ from training on" in str(err.value)
