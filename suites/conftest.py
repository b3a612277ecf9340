"""Fixtures the checks share beyond the plugin's (`bundle`, `draft_name`, `engine`, `report`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from harness.engines.base import Engine, Generation
from harness.golden.bundle import Bundle, DraftSpec
from harness.golden.oracle import Oracle

# The models are tiny: one intra-op thread is as fast as two when the machine is idle and
# 10-40x faster when it is not (thread oversubscription on 2-core CI machines).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def oracle(bundle: Bundle) -> Oracle:
    return Oracle(bundle)


@pytest.fixture
def spec(bundle: Bundle, draft_name: str) -> DraftSpec:
    return bundle.draft(draft_name)



@pytest.fixture
def generate() -> Callable[[Engine, Sequence[Sequence[int]], int, bool], Generation]:
    """Greedy generation memoised on the engine instance: acceptance, vocabulary and
    losslessness checks judge the same run instead of paying for it three times (and a new
    engine for the next draft starts with an empty memo)."""

    def run(engine: Engine, prompts: Sequence[Sequence[int]], max_new_tokens: int,
            speculative: bool) -> Generation:
        memo: dict = engine.__dict__.setdefault("_suite_generations", {})
        key = (tuple(tuple(p) for p in prompts), speculative, max_new_tokens)
        if key not in memo:
            memo[key] = engine.generate(prompts, max_new_tokens, speculative)
        return memo[key]

    return run
