"""The canary: a wiring verdict from acceptance counters alone, for an engine reachable only
through its public API (a server). In the spirit of SpecForge's train-to-serve gate (overfit
one sample, serve it, require a whole draft block accepted): the bundle picked, per draft,
the held-out prompts on which serving as trained beats every wrong wiring by most, measured
both, and drew a line between them (manifest `drafts.<name>.canary`); the engine's counters
must reach it. No capture hook, no trace: `Generation.acceptance` is all it reads."""

from __future__ import annotations

import pytest

from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.acceptance import heldout_prompts, same_dtype_acceptance
from harness.judgement.assertions import assert_canary_accepts, canary_line, fail, require
from harness.judgement.precision import same_dtype_acceptance as in_reduced_precision


def test_canary_acceptance(engine: Engine, oracle: Oracle, draft_name: str, report, generate) -> None:
    require(engine, Capability.GENERATE)
    spec = oracle.spec(draft_name)
    canary = oracle.bundle.manifest["drafts"][draft_name].get("canary")
    if canary is None:
        pytest.skip(f"bundle {oracle.bundle.path} records no canary for {draft_name} (built before "
                    f"the canary existed); rebuild it with `eagle3-conformance golden build`")
    k = engine.options.num_draft_tokens
    if k != spec.num_draft_tokens:
        pytest.skip(f"the canary line is measured at k={spec.num_draft_tokens} draft tokens, the "
                    f"engine runs k={k}")
    held = heldout_prompts(oracle)
    prompts = [held[i] for i in canary["prompts"]]
    new_tokens = int(oracle.bundle.manifest["heldout"]["max_new_tokens"])
    gen = generate(engine, prompts, new_tokens, True)
    if gen.acceptance is None or gen.acceptance.num_drafts == 0:
        fail(f"{engine.name} reported no speculative rounds: speculation did not run",
             draft=draft_name, engine_name=engine.name, prompts=prompts)
    measured = gen.acceptance.mean_acceptance_length
    report.metric(draft_name, "canary_acceptance_length", round(measured, 4))
    # the same-dtype reference counted as the engine counts (Engine.draft_budget); the fp32
    # line is the bundle's, counted in full (no per-round canary trace is stored to replay): a
    # capped engine (llama.cpp) pays its shortened last drafts against it, ~2.5% of the mean on
    # 36-token requests (measured on the pinned prompts, not on the canary's)
    own = in_reduced_precision(engine.options.dtype, lambda: same_dtype_acceptance(
        oracle, draft_name, engine.options, prompts, new_tokens, engine.draft_budget))
    if own is not None:
        report.metric(draft_name, "canary_same_dtype_reference", round(own, 4))
    line = canary_line(canary, own)
    if line is None:
        # fp32 (own None): the bundle's own canary, served as trained, is no better than its best
        # wrong wiring (an untrained smoke bundle); else the same-dtype reference is not
        served = (f"the bundle's draft served as trained gives {float(canary['served']):.3f}"
                  if own is None else f"the reference engine itself serves {own:.3f}")
        pytest.skip(f"{draft_name}: in {engine.options.dtype} on {engine.options.device} {served} on "
                    f"the canary prompts, no more than the best wrong wiring's "
                    f"{canary['best_wrong']:.3f} ({canary['best_wrong_wiring']}, fp32): the canary "
                    f"cannot tell them apart here; the acceptance checks still judge it")
    report.metric(draft_name, "canary_threshold", round(line, 4))
    assert_canary_accepts(measured, canary, engine_name=engine.name, draft=draft_name, prompts=prompts,
                          same_dtype=own)
