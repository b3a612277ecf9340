"""fc projection: applied once, to the target features, with the trained norms — and never
skipped because the widths happen to coincide (the single-aux draft makes them coincide)."""

from __future__ import annotations

import pytest

from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle
from harness.judgement.assertions import assert_fc_matches, fail, require
from harness.judgement.finite import assert_finite
from harness.judgement.precision import reference_fc


def test_fc_output_matches_training(engine: Engine, oracle: Oracle, draft_name: str) -> None:
    """fc is judged on the engine's OWN features, so a capture bug does not masquerade as an
    fc bug: this isolates the projection (and its norm_before_fc / fc_norm flags)."""
    require(engine, Capability.FC_PROBE)
    batch = oracle.pinned_prompts
    capture = engine.capture(batch)
    if capture.fc_out is None:
        pytest.skip(f"{engine.name} exposes no fc output for this draft")
    assert_finite("the engine's fc output", capture.fc_out)
    draft = oracle.draft(draft_name)
    width = draft.fc.in_features
    if {int(f.shape[-1]) for f in capture.features} != {width}:
        fail(f"cannot judge fc: the engine's features are not {width} wide "
             f"(test_capture_pinned_prompts names why)", draft=draft_name, engine_name=engine.name,
             prompts=batch)
    assert_fc_matches(fc_out=capture.fc_out, features=capture.features,
                      expected=[oracle.fc(draft_name, f) for f in capture.features],
                      dtype=engine.options.dtype, draft_hidden=draft.cfg.hidden_size,
                      norm_before_fc=draft.cfg.norm_before_fc, fc_norm=draft.cfg.fc_norm,
                      engine_name=engine.name, draft=draft_name, prompts=batch,
                      same_dtype=reference_fc(oracle, draft_name, capture.features, engine.options.dtype))
