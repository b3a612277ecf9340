"""Losslessness: speculative greedy output equals non-speculative greedy output. In reduced
precision a divergence is excused only at a near-tie of the fp32 target (top-2 logit margin
within the dtype's noise); the excused ones are counted in the report. vLLM's own test
settles for 60% exact matches; this suite does not."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.assertions import judge_lossless, require
from harness.run.strategies import prompts as prompt_strategy


def assert_lossless(engine: Engine, oracle: Oracle, batch: list[list[int]], new_tokens: int,
                    generate, report=None, draft: str = "") -> None:
    spec = generate(engine, batch, new_tokens, True)
    plain = generate(engine, batch, new_tokens, False)
    judged = judge_lossless(oracle, batch, spec.tokens, plain.tokens, engine.options.dtype,
                            engine.options.device, draft=draft, engine_name=engine.name)
    if report is not None:
        report.metric(draft, "lossless_excused_near_ties", judged.measured["excused_near_ties"])
        report.metric(draft, "lossless_prompts", len(batch))
    judged.verdict()


def test_lossless_pinned_prompts(engine: Engine, oracle: Oracle, draft_name: str, report,
                                 generate) -> None:
    require(engine, Capability.GENERATE)
    n = int(oracle.bundle.manifest["prompts"]["continuation_len"])
    assert_lossless(engine, oracle, oracle.pinned_prompts, n, generate, report, draft_name)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_lossless_drawn_prompts(engine: Engine, oracle: Oracle, draft_name: str, generate,
                                data: st.DataObject) -> None:
    require(engine, Capability.GENERATE)
    draft = oracle.draft(draft_name)
    prompt = data.draw(prompt_strategy(draft.cfg.vocab_size, oracle.pinned_prompts, 32), label="prompt")
    assert_lossless(engine, oracle, [prompt], 16, generate, draft=draft_name)
