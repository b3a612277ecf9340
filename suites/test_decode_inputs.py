"""Decode-time inputs: what the draft is fed after every verify round (the target's features of
the accepted positions, and the positions it runs them at) is what training feeds it. The
capture checks see only the prefill; a re-feed one row off, draft positions off by one or a
draft cache kept across rejections leave the prefill right and show only here (and, in fp32,
in the exact acceptance trace)."""

from __future__ import annotations

from harness.engines.base import Capability, Engine
from harness.golden.bundle import DraftSpec
from harness.golden.oracle import Oracle
from harness.judgement.assertions import CaptureContext, assert_decode_inputs_match, require


def test_decode_inputs_match_training(engine: Engine, oracle: Oracle, spec: DraftSpec,
                                      draft_name: str) -> None:
    """Every pinned prompt as its own request, continued as long as the golden traces are."""
    require(engine, Capability.DECODE_INPUTS)
    prompts = oracle.pinned_prompts
    decode = engine.decode_inputs(prompts, int(oracle.bundle.manifest["prompts"]["continuation_len"]))
    assert_decode_inputs_match(
        CaptureContext.for_engine(engine, spec, draft_name, "test_decode_inputs_match_training"),
        decode=decode, oracle=oracle, prompts=prompts)
