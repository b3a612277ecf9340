"""Batch invariance: a prompt's features and greedy output do not depend on its batch
companions, padding, order, batch size (1..8) or ragged lengths. Engines that pad or pack
sequences wrongly leak neighbours into the aux states."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engines.base import Capability, Engine
from harness.golden.bundle import DraftSpec
from harness.golden.oracle import Oracle
from harness.judgement.assertions import (
    CaptureContext,
    judge_batch_invariance,
    judge_generation_batch_invariance,
    require,
)
from harness.run.strategies import BatchShape, batch_shapes


def _batch(oracle: Oracle, shape: BatchShape, probe: list[int]) -> list[list[int]]:
    pinned = oracle.pinned_prompts
    companions = [pinned[(i * 7 + 3) % len(pinned)][-n:] or [3] for i, n in enumerate(shape.companion_lengths)]
    return companions[: shape.position] + [probe] + companions[shape.position:]


SETTINGS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(shape=batch_shapes(), data=st.data())
def test_capture_batch_invariant(engine: Engine, oracle: Oracle, draft_name: str, spec: DraftSpec,
                                 shape: BatchShape, data: st.DataObject) -> None:
    require(engine, Capability.CAPTURE)
    probe = data.draw(st.sampled_from(oracle.pinned_prompts), label="probe")
    alone = engine.capture([probe]).features[0]
    batch = _batch(oracle, shape, probe)
    inside = engine.capture(batch).features[shape.position]
    # the evidence for the cause, asked for only on a failure: every member of the batch
    # captured in it and alone
    ctx = CaptureContext.for_engine(
        engine, spec, draft_name, "test_capture_batch_invariant",
        more_evidence=lambda: (batch, engine.capture(batch).features, [oracle.features(p) for p in batch]),
        alone=lambda some: [engine.capture([p]).features[0] for p in some])
    judge_batch_invariance(ctx, inside=inside, alone=alone, probe=probe, batch=batch,
                           position=shape.position, companion_lengths=shape.companion_lengths,
                           oracle=oracle).verdict()


@SETTINGS
@given(shape=batch_shapes(), data=st.data())
def test_generation_batch_invariant(engine: Engine, oracle: Oracle, draft_name: str,
                                    shape: BatchShape, data: st.DataObject, generate) -> None:
    require(engine, Capability.GENERATE)
    probe = data.draw(st.sampled_from(oracle.pinned_prompts), label="probe")
    alone = generate(engine, [probe], 16, True).tokens[0]
    batch = _batch(oracle, shape, probe)
    inside = generate(engine, batch, 16, True).tokens[shape.position]
    judge_generation_batch_invariance(
        oracle, probe, inside, alone, batch=batch, position=shape.position, size=shape.size,
        companion_lengths=shape.companion_lengths, dtype=engine.options.dtype,
        device=engine.options.device, draft=draft_name, engine_name=engine.name).verdict()
