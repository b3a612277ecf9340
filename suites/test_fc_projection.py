"""fc projection: applied once, to the target features, with the trained norms — and never
skipped because the widths happen to coincide (the single-aux draft makes them coincide)."""

from __future__ import annotations

import pytest

from harness.assertions import ConformanceFailure, reproducer, require, worst_tokens
from harness.diagnose import fc_diagnosis, fc_output_is_raw_input, rtol_for
from harness.engines.base import Capability, Engine
from harness.golden.oracle import Oracle


def test_fc_output_matches_training(engine: Engine, oracle: Oracle, draft_name: str) -> None:
    """fc is judged on the engine's OWN features, so a capture bug does not masquerade as an
    fc bug: this isolates the projection (and its norm_before_fc / fc_norm flags)."""
    require(engine, Capability.FC_PROBE)
    batch = oracle.pinned_prompts
    capture = engine.capture(batch)
    if capture.fc_out is None:
        pytest.skip(f"{engine.name} exposes no fc output for this draft")
    draft = oracle.draft(draft_name)
    width = draft.fc.in_features
    if {int(f.shape[-1]) for f in capture.features} != {width}:
        pytest.fail(f"cannot judge fc: the engine's features are not {width} wide "
                    f"(test_capture_pinned_prompts names why)")
    expected = [oracle.fc(draft_name, f) for f in capture.features]
    rtol = rtol_for(engine.options.dtype)
    bad, total, worst = worst_tokens(capture.fc_out, expected, rtol)
    if not bad:
        return
    raw = [fc_output_is_raw_input(o, f, rtol) for o, f in zip(capture.fc_out, capture.features, strict=True)]
    detail = (f"the draft's fc output differs from fc(features) on {bad}/{total} tokens "
              f"(worst relative error {worst:.3g}, tolerance {rtol:g})")
    slot = next((r for r in raw if r is not None), None)
    diag = None if slot is None else fc_diagnosis(
        "fc_skipped", f"{detail}; it equals aux slot {slot} unprojected (fc input width {width}, "
                      f"draft hidden {draft.cfg.hidden_size})")
    message = diag.message if diag else (
        f"{detail}; fc weights or its norm flags (norm_before_fc={draft.cfg.norm_before_fc}, "
        f"fc_norm={draft.cfg.fc_norm}) are not applied as trained")
    raise ConformanceFailure(message + "\n" + reproducer(engine.name, draft_name, batch,
                                                         "test_fc_output_matches_training"),
                             [diag] if diag else [])
