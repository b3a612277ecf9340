"""Acceptance: the engine's greedy chain acceptance against (a) the golden simulated trace of
the training-time reference and (b) the prediction from training's per-step accuracy.
Both numbers are printed and land in report.json whatever the outcome."""

from __future__ import annotations

from harness.acceptance import (
    acceptance_from_traces,
    explain_shortfall,
    golden_traces,
    heldout_prompts,
)
from harness.assertions import ConformanceFailure, require
from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.tolerances import tolerance_for


def _new_tokens(oracle: Oracle) -> int:
    return int(oracle.bundle.manifest["prompts"]["continuation_len"])


def test_acceptance_matches_golden_trace(engine: Engine, oracle: Oracle, draft_name: str,
                                         report, generate) -> None:
    require(engine, Capability.GENERATE)
    k = engine.options.num_draft_tokens
    spec = oracle.spec(draft_name)
    golden = golden_traces(oracle, draft_name)
    gen = generate(engine, oracle.pinned_prompts, _new_tokens(oracle), True)
    expected = acceptance_from_traces(golden, spec.num_draft_tokens)
    measured = gen.acceptance
    assert measured is not None and measured.num_drafts > 0, \
        f"{engine.name} reported no speculative rounds: speculation did not run"
    report.metric(draft_name, "acceptance_length", round(measured.mean_acceptance_length, 4))
    report.metric(draft_name, "golden_acceptance_length", round(expected.mean_acceptance_length, 4))
    report.metric(draft_name, "acceptance_per_position", [round(r, 4) for r in measured.per_position_rate])
    if k != spec.num_draft_tokens:
        import pytest

        pytest.skip(f"golden traces are for k={spec.num_draft_tokens} draft tokens, the engine runs k={k}")
    if engine.options.dtype == "float32" and gen.traces is not None:
        # Greedy chain drafting is deterministic: an fp32 engine must reproduce the golden
        # trace round by round, which a bug that only bites after a rejection cannot fake.
        diffs = [(i, next(r for r in range(max(len(e), len(g))) if e[r:r + 1] != g[r:r + 1]))
                 for i, (e, g) in enumerate(zip(gen.traces, golden, strict=True)) if e != g]
        if diffs:
            i, r = diffs[0]
            diag = explain_shortfall(engine, oracle, draft_name, gen, golden)
            raise ConformanceFailure(
                f"per-round acceptance differs from the golden trace on {len(diffs)}/{len(golden)} "
                f"pinned prompts (fp32 must match exactly); first: prompt {i} round {r}: engine "
                f"{gen.traces[i][:r + 1]} vs golden {golden[i][:r + 1]}. {diag.message}", [diag])
    tol = tolerance_for(engine.options.dtype).trace
    gap = abs(measured.mean_acceptance_length - expected.mean_acceptance_length)
    if gap > tol * expected.mean_acceptance_length:
        diag = explain_shortfall(engine, oracle, draft_name, gen, golden)
        raise ConformanceFailure(
            f"mean acceptance length {measured.mean_acceptance_length:.3f} vs golden simulated "
            f"{expected.mean_acceptance_length:.3f} on the pinned prompts (k={k}; tolerance "
            f"±{tol:.0%} for {engine.options.dtype}); per-position acceptance "
            f"{[round(r, 2) for r in measured.per_position_rate]} vs golden "
            f"{[round(r, 2) for r in expected.per_position_rate]}. {diag.message}", [diag])


def test_acceptance_meets_training_prediction(engine: Engine, oracle: Oracle, draft_name: str,
                                              report, generate) -> None:
    require(engine, Capability.GENERATE)
    spec = oracle.spec(draft_name)
    prompts = heldout_prompts(oracle)
    gen = generate(engine, prompts, _new_tokens(oracle), True)
    measured = gen.acceptance
    assert measured is not None and measured.num_drafts > 0, \
        f"{engine.name} reported no speculative rounds: speculation did not run"
    predicted = spec.predicted_acceptance_length
    report.metric(draft_name, "heldout_acceptance_length", round(measured.mean_acceptance_length, 4))
    report.metric(draft_name, "predicted_acceptance_length", round(predicted, 4))
    report.metric(draft_name, "training_measured_acceptance_length", spec.measured_acceptance_length)
    margin = tolerance_for(engine.options.dtype).prediction_margin
    if measured.mean_acceptance_length < predicted * (1 - margin):
        diag = explain_shortfall(engine, oracle, draft_name, gen, None)
        raise ConformanceFailure(
            f"held-out mean acceptance length {measured.mean_acceptance_length:.3f} is more than "
            f"{margin:.0%} below the training-time prediction {predicted:.3f} "
            f"(acc_k {list(spec.acc_k)}, k={spec.num_draft_tokens}). {diag.message}", [diag])
