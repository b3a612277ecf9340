"""A capture under a placement over several processes that hands the draft a shard of each
aux state, or nothing, fails the capture check with a named cause (issue #38):
`capture_shard`, `capture_missing_rank` (harness/diagnosis/placement.py). Each is shown on
its zoo mutant through the path a suite run takes (the fc crash diagnosed as the plugin does;
the adapter's reported features judged by the capture assertion), and each fingerprint is
shown unable to fire where it has no evidence (a width that is also a whole number of slots;
fewer slots without a declared pipeline; the reference engine)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import torch
from golden_oracle import committed_oracle

from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.placement import placement_diagnosis
from harness.engines.base import EngineCrash, EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import CaptureMissingRank, CaptureShard
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches_oracle,
    crash_failure,
)

HIDDEN = 128  # the committed bundle's target


@cache
def _engine(cls: type[ReferenceEngine], draft: str) -> ReferenceEngine:
    bundle = committed_oracle().bundle
    spec = bundle.draft(draft)
    return cls(bundle.target_dir, bundle.draft_dir(draft),
               EngineOptions(num_draft_tokens=spec.num_draft_tokens, training_convention=spec.convention))


def _prompts() -> list[list[int]]:
    return sorted(committed_oracle().pinned_prompts, key=len)[-3:]


def _crash_kind(cls: type[ReferenceEngine], draft: str) -> tuple[str, str]:
    """The capture check's failure on this engine and draft, as the plugin builds it from the
    engine's crash (harness.run.plugin._crash_failure)."""
    engine = _engine(cls, draft)
    spec = committed_oracle().bundle.draft(draft)
    with pytest.raises(EngineCrash) as crash:
        engine.capture(_prompts())
    failure = crash_failure(crash.value, layer_ids=spec.layer_ids, target_hidden=HIDDEN,
                            engine_name=engine.name, draft=draft,
                            engine_convention=engine.convention,
                            training_boundaries=spec.boundaries, num_layers=engine.num_layers,
                            pipeline_stages=getattr(engine, "pipeline_stages", None))
    diag = failure.diagnoses[0]
    return diag.kind, diag.message


@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "single-aux", "final-aux"])
def test_a_shard_fed_to_fc_is_named_capture_shard(draft: str) -> None:
    kind, message = _crash_kind(CaptureShard, draft)
    assert kind == "capture_shard", message
    assert "world size 2" in message and "all-gather" in message


@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "final-aux"])
def test_the_last_stage_alone_is_named_capture_missing_rank(draft: str) -> None:
    kind, message = _crash_kind(CaptureMissingRank, draft)
    assert kind == "capture_missing_rank", message
    assert "[0, 4]" in message  # the declared stages, and the boundaries they put elsewhere


def test_without_a_declared_pipeline_fewer_slots_are_no_pipeline_claim() -> None:
    """The same crash from an engine that declares no pipeline: the width alone does not say
    which slots went missing, so no placement is named."""
    engine = _engine(CaptureMissingRank, "specforge-default")
    spec = committed_oracle().bundle.draft("specforge-default")
    with pytest.raises(EngineCrash) as crash:
        engine.capture(_prompts())
    diag = crash_diagnosis(str(crash.value), spec.layer_ids, HIDDEN,
                           training_boundaries=spec.boundaries, num_layers=engine.num_layers)
    assert diag.kind == "engine_crash", diag.message


def _judge(features: list[torch.Tensor], draft: str, **declared: Any) -> ConformanceFailure:
    oracle = committed_oracle()
    spec = oracle.bundle.draft(draft)
    ctx = CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype="float32",
                         engine_name="adapter", draft=draft, check="test_capture_pinned_prompts", **declared)
    with pytest.raises(ConformanceFailure) as failed:
        assert_capture_matches_oracle(ctx, features=features, oracle=oracle, prompts=_prompts())
    return failed.value


@torch.no_grad()
def _reported(cls: type[ReferenceEngine], draft: str) -> list[torch.Tensor]:
    """What the mutant's capture holds before its fc runs: the features its adapter would
    report, per prompt (one prompt per forward, no padding)."""
    engine = _engine(cls, draft)
    out = []
    for p in _prompts():
        _, aux = engine.target_forward(torch.tensor([p]), torch.arange(len(p))[None], None)
        out.append(aux[0].float())
    return out


def test_an_adapter_reporting_a_shard_fails_capture_shard() -> None:
    failure = _judge(_reported(CaptureShard, "specforge-default"), "specforge-default")
    assert failure.diagnoses[0].kind == "capture_shard", str(failure)


def test_an_adapter_reporting_nothing_fails_capture_missing_rank() -> None:
    """A pipeline rank other than the last has no aux state to report: zero columns."""
    nothing = [torch.zeros(len(p), 0) for p in _prompts()]
    failure = _judge(nothing, "specforge-default")
    assert failure.diagnoses[0].kind == "capture_missing_rank", str(failure)


def test_an_adapter_reporting_the_last_stage_fails_capture_missing_rank() -> None:
    failure = _judge(_reported(CaptureMissingRank, "specforge-default"), "specforge-default",
                     pipeline_stages=(0, 4))
    assert failure.diagnoses[0].kind == "capture_missing_rank", str(failure)


def test_the_reference_passes_with_a_declared_pipeline() -> None:
    """A correct capture is unaffected by the declaration (the fingerprint reads widths only)."""
    oracle = committed_oracle()
    spec = oracle.bundle.draft("specforge-default")
    ctx = CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype="float32",
                         engine_name="reference", draft="specforge-default",
                         check="test_capture_pinned_prompts", pipeline_stages=(0, 4))
    diag = assert_capture_matches_oracle(ctx, features=_reported(ReferenceEngine, "specforge-default"),
                                         oracle=oracle, prompts=_prompts())
    assert diag.kind == "ok", diag.message


@pytest.mark.parametrize(("fed", "fc", "stages", "kind"), [
    (192, 384, None, "capture_shard"),          # 3 slots of H/2
    (64, 128, None, "capture_shard"),           # 1 slot of H/2
    (128, 384, None, None),                     # 3 slots of H/3, or one whole slot: not told apart
    (256, 512, None, None),                     # 4 slots of H/2 = 2 whole slots: not told apart
    (256, 384, None, None),                     # 2 of 3 slots, no declared pipeline
    (256, 384, (0, 4), "capture_missing_rank"),
    (128, 384, (0, 4), None),                   # 1 slot, but the last stage holds 2 of [2, 4, 5]
    (0, 384, None, "capture_missing_rank"),
    (384, 384, (0, 4), None),                   # the full width: nothing to name
])
def test_the_width_rule(fed: int, fc: int, stages: tuple[int, ...] | None, kind: str | None) -> None:
    diag = placement_diagnosis(fed, fc, HIDDEN, source="the adapter reported",
                               training_boundaries=[2, 4, 5], pipeline_stages=stages)
    assert (diag.kind if diag else None) == kind


def _fc_width_error(fed_width: int, fc_width: int) -> str:
    """The error torch itself raises where fc (fc_width -> H) is fed fed_width columns."""
    fc = torch.nn.Linear(fc_width, HIDDEN, bias=False)
    with pytest.raises(RuntimeError) as err:
        fc(torch.zeros(4, fed_width))
    return str(err.value)


@pytest.mark.parametrize(("ids", "fed", "world"), [
    ([3, 0], 128, 2),           # zoo:capture_shard on a drawn two-id list (H100, bf16 selftest)
    ([1, 2, 3, 4], 256, 2),     # 4 slots of H/2 = 2 whole slots
])
def test_a_shard_that_is_also_whole_slots_is_ambiguous(ids: list[int], fed: int, world: int) -> None:
    """The width 2 x H/2 is also one whole slot of two: missing slots and a tensor-parallel
    shard fit it alike, so the crash's diagnosis says ambiguous, names capture_shard as the
    rival and what separates them, and claims nothing about the embedding (no id is negative).
    Before, it said "some ids match no captured layer ... Training fed the embedding output
    there" as a decided cause: the one wrong name of the GPU bf16 self-test at 4cf94bc."""
    diag = crash_diagnosis(_fc_width_error(fed, len(ids) * HIDDEN), ids, HIDDEN)
    assert diag.kind == "engine_crash" and diag.message.startswith("ambiguous"), diag.message
    assert diag.details["ambiguous_with"] == "capture_shard" and diag.details["world_size"] == world
    assert diag.details["confidence_margin"] == 1.0
    assert "per-slot width" in diag.message and "embedding" not in diag.message


def test_missing_slots_no_shard_fits_are_decided_and_claim_no_embedding() -> None:
    """2 of 3 whole slots: no shard of H gives 256 of 384 (W = 1.5), so the crash's own cause
    stands, decided, and without a claim about what training fed the missing slot."""
    diag = crash_diagnosis(_fc_width_error(256, 384), [1, 3, 4], HIDDEN)
    assert diag.kind == "engine_crash" and "ambiguous_with" not in diag.details, diag.message
    assert "some ids match no captured layer" in diag.message and "embedding" not in diag.message


def test_the_ambiguity_is_settled_by_a_decisive_shard_of_the_same_verdict() -> None:
    """The observed-convention check serves several lists: a three-id list's shard (192 of 384,
    no whole number of slots) names capture_shard decisively, which settles the two-id list's
    ambiguity (harness.diagnosis.compare.settled); alone, the ambiguity stays."""
    from harness.diagnosis.compare import settled

    decisive = crash_diagnosis(_fc_width_error(192, 384), [1, 5, 3], HIDDEN)
    ambiguous = crash_diagnosis(_fc_width_error(128, 256), [3, 0], HIDDEN)
    assert decisive.kind == "capture_shard"
    assert [d.kind for d in settled([decisive, ambiguous])] == ["capture_shard"]
    assert settled([ambiguous]) == [ambiguous]
