"""Acceptance: the engine's greedy chain acceptance against (a) the golden simulated trace of
the training-time reference and (b) the prediction from training's per-step accuracy.
Both numbers are printed and land in report.json whatever the outcome."""

from __future__ import annotations

import itertools
import operator

import pytest

from harness.engines.base import Acceptance, Capability, Engine, Generation
from harness.golden.oracle import Oracle
from harness.judgement.acceptance import (
    acceptance_from_traces,
    golden_traces,
    heldout_prompts,
    judge_golden_acceptance,
    judge_prediction,
    judge_trace_exact,
)
from harness.judgement.assertions import fail, require
from harness.judgement.precision import traces_exact


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
    # counted as the engine counts (Engine.draft_budget): llama.cpp caps its last drafts at
    # the tokens left, the golden trace drafts every round in full
    expected = acceptance_from_traces(golden, spec.num_draft_tokens, engine.draft_budget,
                                      _new_tokens(oracle))
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
        judge_trace_exact(engine, oracle, draft_name, gen, golden, prompts, _new_tokens(oracle)).verdict()
    judged = judge_golden_acceptance(engine, oracle, draft_name, gen, golden, prompts, measured,
                                     expected, _new_tokens(oracle))
    own = judged.bound["same_dtype_reference"]  # reduced precision, measured past the fp32 bound
    if own is not None:
        report.metric(draft_name, "same_dtype_reference_acceptance_length", round(own, 4))
    judged.verdict()


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
    judge_prediction(engine, oracle, draft_name, gen, prompts, measured).verdict()
