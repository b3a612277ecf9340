"""Acceptance: the engine's greedy chain acceptance against (a) the golden simulated trace of
the training-time reference and (b) the prediction from training's per-step accuracy.
Both numbers are printed and land in report.json whatever the outcome."""

from __future__ import annotations

import itertools
import operator

import pytest

from harness.core.tolerances import tolerance_for
from harness.engines.base import Acceptance, Capability, Engine, Generation
from harness.golden.oracle import Oracle
from harness.judgement.acceptance import (
    acceptance_from_traces,
    explain_shortfall,
    golden_traces,
    heldout_prompts,
    same_dtype_acceptance,
)
from harness.judgement.assertions import fail, require
from harness.judgement.precision import trace_allowance, traces_exact


def _new_tokens(oracle: Oracle) -> int:
    return int(oracle.bundle.manifest["prompts"]["continuation_len"])


def _speculated(engine: Engine, gen: Generation, draft: str, prompts: list[list[int]]) -> Acceptance:
    """The run's acceptance counters; a run without speculative rounds fails the check."""
    if gen.acceptance is None or gen.acceptance.num_drafts == 0:
        fail(f"{engine.name} reported no speculative rounds: speculation did not run", draft=draft,
             engine_name=engine.name, prompts=prompts)
    return gen.acceptance


def test_acceptance_matches_golden_trace(engine: Engine, oracle: Oracle, draft_name: str,
                                         report, generate) -> None:
    require(engine, Capability.GENERATE)
    k = engine.options.num_draft_tokens
    spec = oracle.spec(draft_name)
    golden = golden_traces(oracle, draft_name)
    prompts = oracle.pinned_prompts
    gen = generate(engine, prompts, _new_tokens(oracle), True)
    expected = acceptance_from_traces(golden, spec.num_draft_tokens)
    measured = _speculated(engine, gen, draft_name, prompts)
    report.metric(draft_name, "acceptance_length", round(measured.mean_acceptance_length, 4))
    report.metric(draft_name, "golden_acceptance_length", round(expected.mean_acceptance_length, 4))
    report.metric(draft_name, "acceptance_per_position", [round(r, 4) for r in measured.per_position_rate])
    report.metric(draft_name, "golden_acceptance_per_position",
                  [round(r, 4) for r in expected.per_position_rate])
    if k != spec.num_draft_tokens:
        pytest.skip(f"golden traces are for k={spec.num_draft_tokens} draft tokens, the engine runs k={k}")
    if gen.traces is None:
        report.not_run("exact trace check", "the adapter exposes no traces")
    elif not traces_exact(engine.options.dtype):
        report.not_run("exact trace check", f"the engine runs in {engine.options.dtype}; traces are "
                       "compared round by round only in fp32")
    if traces_exact(engine.options.dtype) and gen.traces is not None:
        # Greedy chain drafting is deterministic: an fp32 engine must reproduce the golden
        # trace round by round, which a bug that only bites after a rejection cannot fake.
        diffs = [(i, next(r for r in range(max(len(e), len(g))) if e[r:r + 1] != g[r:r + 1]))
                 for i, (e, g) in enumerate(zip(gen.traces, golden, strict=True)) if e != g]
        if diffs:
            i, r = diffs[0]
            diag = explain_shortfall(engine, oracle, draft_name, gen, golden)
            fail(f"per-round acceptance differs from the golden trace on {len(diffs)}/{len(golden)} "
                 f"pinned prompts (fp32 must match exactly); first: prompt {i} round {r}: engine "
                 f"{gen.traces[i][:r + 1]} vs golden {golden[i][:r + 1]}. {diag.message}",
                 draft=draft_name, engine_name=engine.name, prompts=[prompts[i]], diagnoses=[diag])
    gap = abs(measured.mean_acceptance_length - expected.mean_acceptance_length)
    # reduced precision: plus what this dtype moves the reference's own trace on this device
    allowed, own = trace_allowance(expected.mean_acceptance_length, gap, engine.options.dtype,
                                   lambda: same_dtype_acceptance(oracle, draft_name, engine.options,
                                                                 prompts, _new_tokens(oracle)))
    if own is not None:
        report.metric(draft_name, "same_dtype_reference_acceptance_length", round(own, 4))
    if gap > allowed:
        diag = explain_shortfall(engine, oracle, draft_name, gen, golden)
        fail(f"mean acceptance length {measured.mean_acceptance_length:.3f} vs golden simulated "
             f"{expected.mean_acceptance_length:.3f} on the pinned prompts (k={k}; allowed gap "
             f"{allowed:.3f} for {engine.options.dtype}); per-position acceptance "
             f"{[round(r, 2) for r in measured.per_position_rate]} vs golden "
             f"{[round(r, 2) for r in expected.per_position_rate]}. {diag.message}",
             draft=draft_name, engine_name=engine.name, prompts=prompts, diagnoses=[diag])


def test_acceptance_meets_training_prediction(engine: Engine, oracle: Oracle, draft_name: str,
                                              report, generate) -> None:
    require(engine, Capability.GENERATE)
    spec = oracle.spec(draft_name)
    prompts = heldout_prompts(oracle)
    gen = generate(engine, prompts, _new_tokens(oracle), True)
    measured = _speculated(engine, gen, draft_name, prompts)
    predicted = spec.predicted_acceptance_length
    report.metric(draft_name, "heldout_acceptance_length", round(measured.mean_acceptance_length, 4))
    report.metric(draft_name, "predicted_acceptance_length", round(predicted, 4))
    report.metric(draft_name, "training_measured_acceptance_length", spec.measured_acceptance_length)
    # position k is accepted only if every earlier one was: training predicts prod_{j<=k} acc_j
    report.metric(draft_name, "predicted_acceptance_per_position",
                  [round(r, 4) for r in itertools.accumulate(spec.acc_k[:spec.num_draft_tokens],
                                                             operator.mul)])
    margin = tolerance_for(engine.options.dtype).prediction_margin
    if measured.mean_acceptance_length < predicted * (1 - margin):
        diag = explain_shortfall(engine, oracle, draft_name, gen, None)
        fail(f"held-out mean acceptance length {measured.mean_acceptance_length:.3f} is more than "
             f"{margin:.0%} below the training-time prediction {predicted:.3f} "
             f"(acc_k {list(spec.acc_k)}, k={spec.num_draft_tokens}). {diag.message}",
             draft=draft_name, engine_name=engine.name, prompts=prompts, diagnoses=[diag])
