"""Aux capture: the features the engine hands the draft equal the training boundaries, per
slot and per token. This is the check that catches the layer-id disagreements of docs/DESIGN.md."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engines.base import Capability, Engine
from harness.golden.bundle import DraftSpec
from harness.golden.oracle import Oracle
from harness.judgement.assertions import CaptureContext, assert_capture_matches_oracle, require
from harness.run.strategies import prompts


def _check(engine: Engine, oracle: Oracle, spec: DraftSpec, draft_name: str,
           batch: list[list[int]], check: str, report=None, context: bool = False) -> None:
    capture = engine.capture(batch)
    pinned = oracle.pinned_prompts
    ctx = CaptureContext.for_engine(
        engine, spec, draft_name, check, pipeline_stages=getattr(engine, "pipeline_stages", None),
        alone=lambda some: [engine.capture([p]).features[0] for p in some],
        more_evidence=(lambda: (pinned, engine.capture(pinned).features, [oracle.features(p) for p in pinned]))
        if context else None)
    diag = assert_capture_matches_oracle(ctx, features=capture.features, oracle=oracle, prompts=batch)
    if report is not None:
        report.metric(draft_name, "capture_worst_rel_error",
                      max((s.rel_error for s in diag.slots), default=0.0))
        if "precision" in diag.details:  # tokens precision made ambiguous, reported as such
            report.metric(draft_name, "capture_precision", diag.details["precision"])


def test_capture_pinned_prompts(engine: Engine, oracle: Oracle, spec: DraftSpec, draft_name: str,
                                report) -> None:
    """All pinned prompts in one ragged batch (lengths 1, 2 .. 32)."""
    require(engine, Capability.CAPTURE)
    _check(engine, oracle, spec, draft_name, oracle.pinned_prompts, "test_capture_pinned_prompts", report)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_capture_drawn_prompts(engine: Engine, oracle: Oracle, spec: DraftSpec, draft_name: str,
                               data: st.DataObject) -> None:
    """Hypothesis-drawn prompts (edge lengths, tokens outside the draft vocab), golden
    features computed on the fly by the fp32 training reference."""
    require(engine, Capability.CAPTURE)
    draft = oracle.draft(draft_name)
    outside = (~draft.t2d).nonzero().flatten()[3:].tolist()
    prompt = data.draw(prompts(draft.cfg.vocab_size, oracle.pinned_prompts, 32, outside), label="prompt")
    _check(engine, oracle, spec, draft_name, [prompt], "test_capture_drawn_prompts", context=True)
