"""Vocabulary mapping: the draft proposes over a reduced vocabulary; `d2t` holds offsets
(target id = i + d2t[i]). An engine that reads d2t as absolute ids proposes tokens outside
`t2d`, and acceptance collapses while output stays correct."""

from __future__ import annotations

import pytest

from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.assertions import judge_drafted_vocab, require


def test_drafted_tokens_inside_draft_vocab(engine: Engine, oracle: Oracle, draft_name: str,
                                           generate) -> None:
    require(engine, Capability.GENERATE)
    n = int(oracle.bundle.manifest["prompts"]["continuation_len"])
    gen = generate(engine, oracle.pinned_prompts, n, True)
    if gen.proposed is None:
        pytest.skip(f"{engine.name} does not expose the drafted tokens; "
                    f"acceptance checks still cover a wrong vocabulary map")
    draft = oracle.draft(draft_name)
    judge_drafted_vocab(gen.proposed, draft.t2d, draft.cfg.draft_vocab_size, draft=draft_name,
                        engine_name=engine.name, prompts=oracle.pinned_prompts).verdict()
