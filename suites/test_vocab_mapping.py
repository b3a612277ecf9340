"""Vocabulary mapping: the draft proposes over a reduced vocabulary; `d2t` holds offsets
(target id = i + d2t[i]). An engine that reads d2t as absolute ids proposes tokens outside
`t2d`, and acceptance collapses while output stays correct."""

from __future__ import annotations

import pytest

from harness.diagnosis.draft_side import fc_diagnosis
from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.assertions import fail, require


def test_drafted_tokens_inside_draft_vocab(engine: Engine, oracle: Oracle, draft_name: str,
                                           generate) -> None:
    require(engine, Capability.GENERATE)
    n = int(oracle.bundle.manifest["prompts"]["continuation_len"])
    gen = generate(engine, oracle.pinned_prompts, n, True)
    if gen.proposed is None:
        pytest.skip(f"{engine.name} does not expose the drafted tokens; "
                    f"acceptance checks still cover a wrong vocabulary map")
    draft = oracle.draft(draft_name)
    proposed = [t for row in gen.proposed for t in row]
    if not proposed:
        fail(f"{engine.name} drafted no tokens: speculation did not run", draft=draft_name,
             engine_name=engine.name, prompts=oracle.pinned_prompts)
    outside = sorted({t for t in proposed if not bool(draft.t2d[t])})
    if outside:
        as_draft_ids = [t for t in outside if t < draft.cfg.draft_vocab_size]
        hint = (f"{len(as_draft_ids)}/{len(outside)} of them are below draft_vocab_size "
                f"{draft.cfg.draft_vocab_size}, the signature of d2t read as absolute ids")
        diag = fc_diagnosis("d2t_absolute", f"drafted tokens {outside[:8]} are not in t2d; {hint}")
        fail(diag.message, draft=draft_name, engine_name=engine.name,
             prompts=oracle.pinned_prompts, diagnoses=[diag])
