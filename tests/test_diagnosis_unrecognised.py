"""A bug outside every diagnosis class comes out `unrecognised` with its evidence, never a
known class by elimination: a mutant written here (not in the zoo: it has no class to prove)
hands the draft each boundary rotated by a fixed orthogonal matrix, norm kept, so no golden
state and no fitted model (precision, normalisation, partial sum, shift, swap, layout) fits."""

from __future__ import annotations

import pytest
import torch
from golden_oracle import committed_oracle

from harness.diagnosis.capture import diagnose_capture
from harness.engines.base import EngineOptions
from harness.engines.zoo import Mutant
from harness.models.residual import TargetStates


class AuxRotated(Mutant):
    """Every aux state multiplied by one random orthogonal matrix (a bug of no known class)."""

    name = "tests:aux_rotated"
    bug_class = "aux states rotated by a fixed orthogonal matrix"
    expected_diagnosis_kind = "unrecognised"
    hook = "take_state"
    issue = "none (outside every class on purpose)"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        q, _ = torch.linalg.qr(torch.randn(x.shape[-1], x.shape[-1],
                                           generator=torch.Generator().manual_seed(7)))
        return x @ q


_oracle = committed_oracle


@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "final-aux"])
def test_a_bug_outside_every_class_is_unrecognised_with_its_evidence(draft: str) -> None:
    oracle = _oracle()
    spec = oracle.spec(draft)
    engine = AuxRotated(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft),
                        EngineOptions(num_draft_tokens=spec.num_draft_tokens,
                                      training_convention=spec.convention))
    try:
        prompts = oracle.pinned_prompts
        features = engine.capture(prompts).features
        alone = [engine.capture([p]).features[0] for p in prompts]
    finally:
        engine.close()
    d = diagnose_capture(features, [oracle.features(p) for p in prompts], spec.boundaries,
                         engine_convention=engine.convention, config_ids=spec.layer_ids, alone=alone)
    assert d.kind == "unrecognised", d.message
    assert d.details["confidence_margin"] == 0.0
    seen = d.details["seen"]
    assert [s["expected"] for s in seen] == list(spec.boundaries)
    for s in seen:  # per slot: the nearest states with their distances, and which tokens
        assert len(s["nearest"]) == 2 and all(c["median_rel_error"] > 0.1 for c in s["nearest"])
        assert s["first_off_tokens"]
    assert "Seen per slot: slot 0" in d.message
