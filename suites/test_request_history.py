"""Request-order and history independence: a prompt served as its own request gets the same
captured features, tokens and per-round acceptance whatever the engine served before it. An
engine that keeps state between requests (a draft cache or aux buffer reused uncleared)
passes every single-call check and still serves a user's second request differently from
their first; Hypothesis, which replays examples, would see such an engine as flaky rather
than wrong, so this check compares two servings itself, in one deterministic test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.acceptance import heldout_prompts
from harness.judgement.assertions import assert_history_independent

PROBES = 4  # pinned prompts served twice
EARLIER = 3  # unrelated held-out prompts served between the two servings
NEW_TOKENS = 16


def _serve(engine: Engine, prompts: Sequence[Sequence[int]]) -> dict[str, list[Any]]:
    """Each prompt as its own request, in the order given: what every declared capability
    returns for it (never memoised: the point is to ask the engine again)."""
    out: dict[str, list[Any]] = {"features": [], "tokens": [], "traces": []}
    for prompt in prompts:
        if Capability.CAPTURE in engine.capabilities:
            out["features"].append(engine.capture([prompt]).features[0])
        if Capability.GENERATE in engine.capabilities:
            gen = engine.generate([prompt], NEW_TOKENS, True)
            out["tokens"].append(gen.tokens[0])
            out["traces"].append(gen.traces[0] if gen.traces is not None else None)
    return out


def test_request_order_and_history_independent(engine: Engine, oracle: Oracle,
                                               draft_name: str) -> None:
    if not {Capability.CAPTURE, Capability.GENERATE} & engine.capabilities:
        pytest.skip(f"{engine.name} declares neither 'capture' nor 'generate': nothing to serve twice")
    pinned = sorted(oracle.pinned_prompts, key=len)
    probes = pinned[-PROBES:]  # the longest: most positions for leftover state to reach
    first = _serve(engine, probes)
    _serve(engine, heldout_prompts(oracle)[:EARLIER])
    second = {k: v[::-1] for k, v in _serve(engine, probes[::-1]).items()}

    def pair(key: str) -> tuple[list[Any], list[Any]] | None:
        if not first[key] or any(x is None for x in first[key] + second[key]):
            return None
        return first[key], second[key]

    assert_history_independent(
        prompts=probes, history=f"after {EARLIER} unrelated requests and in reverse order",
        features=pair("features"), tokens=pair("tokens"), traces=pair("traces"), oracle=oracle,
        dtype=engine.options.dtype, device=engine.options.device, engine_name=engine.name,
        draft=draft_name, check="test_request_order_and_history_independent")
