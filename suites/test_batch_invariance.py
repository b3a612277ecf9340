"""Batch invariance: a prompt's features and greedy output do not depend on its batch
companions, padding, order, batch size (1..8) or ragged lengths. Engines that pad or pack
sequences wrongly leak neighbours into the aux states."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.diagnosis.record import Diagnosis
from harness.engines.base import Capability, Engine
from harness.golden.bundle import DraftSpec
from harness.golden.oracle import Oracle
from harness.judgement.assertions import batch_leaks, diagnose_batch_leak, divergence, fail, require
from harness.judgement.finite import assert_finite
from harness.judgement.precision import leak_evidence
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
    assert_finite("the aux features the engine handed the draft", [alone, inside])
    dtype = engine.options.dtype
    bad = total = 0
    worst, bound = 0.0, ""
    if inside.shape == alone.shape:
        golden, envelope = leak_evidence(oracle, probe, dtype)
        bad, total, worst, bound = batch_leaks(inside, alone, dtype=dtype, golden=golden, envelope=envelope)
    if inside.shape != alone.shape or bad:
        # the evidence for the cause: every member of the batch captured alone and in it
        together = engine.capture(batch).features
        solo = [engine.capture([p]).features[0] for p in batch]
        found = (f"{tuple(inside.shape)} draft features inside the batch, {tuple(alone.shape)} alone"
                 if inside.shape != alone.shape else
                 f"{bad}/{total} tokens off, worst relative error {worst:.3g} (tolerance {bound})")
        diag = diagnose_batch_leak(together, solo, [oracle.features(p) for p in batch],
                                   spec.boundaries, dtype=dtype, engine_convention=engine.convention,
                                   config_ids=spec.layer_ids, found=found)
        fail(f"probe prompt {probe} gets different draft features at batch position "
             f"{shape.position} of {shape.size} (companion lengths {list(shape.companion_lengths)}): "
             f"{found}" + ("; the engine's padding/packing leaks into the aux states"
                           if diag.kind in ("batch_dependent", "request_mixed") else "")
             + f". {diag.message}",
             draft=draft_name, engine_name=engine.name, prompts=batch, diagnoses=[diag])


@SETTINGS
@given(shape=batch_shapes(), data=st.data())
def test_generation_batch_invariant(engine: Engine, oracle: Oracle, draft_name: str,
                                    shape: BatchShape, data: st.DataObject, generate) -> None:
    require(engine, Capability.GENERATE)
    probe = data.draw(st.sampled_from(oracle.pinned_prompts), label="probe")
    alone = generate(engine, [probe], 16, True).tokens[0]
    batch = _batch(oracle, shape, probe)
    inside = generate(engine, batch, 16, True).tokens[shape.position]
    _, failure = divergence(oracle, probe, inside, alone, engine.options.dtype, engine.options.device)
    if failure:
        text = (f"greedy speculative output of a prompt changes with its batch (position "
                f"{shape.position} of {shape.size}, companion lengths {list(shape.companion_lengths)}): "
                f"{failure}")
        diag = Diagnosis(kind="batch_dependent", message=f"{text}; root cause: batch-dependent "
                         "generation — the same prompt decodes differently alone and in a batch, "
                         "beyond the fp32 near-tie noise (the evidence: the first differing token)",
                         engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
                         details={"position": shape.position, "batch_size": shape.size})
        fail(text, draft=draft_name, engine_name=engine.name, prompts=batch, diagnoses=[diag])
