"""Remedies addressed to the right party (issue #31, item 3). An adapter written from
docs/ADAPTERS.md whose capture hook sat on the layer's output instead of its input was named
`offset +1` rightly, but told the vendor to set the ids its config already held. When the
config's ids already mean the training boundaries in the convention the engine declares, the
fault is the engine's capture: the remedy says what the engine does and is addressed to the
engine vendor; where an id list in the engine's convention fixes it, to the draft owner."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from golden_oracle import committed_oracle

from examples.template_adapter import TemplateEngine
from harness.diagnosis.record import Diagnosis
from harness.engines.base import EngineOptions
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches_oracle,
)
from harness.models.residual import TargetStates
from harness.reports.report import ReportCollector
from harness.reports.report_md import render_markdown


class TemplateHookOnLayerOutput(TemplateEngine):
    """The adapter template with its capture hook moved to the layer's output: for boundary b
    (the input of layer b) it reads layer b's output, boundary b+1 (the last layer's output
    stays, there is nothing past it). Its declared convention and the config are untouched."""

    name = "tests:template_hook_on_layer_output"

    def __init__(self, target_dir: Path, draft_dir: Path, options: EngineOptions) -> None:
        super().__init__(target_dir, draft_dir, options)

        def layer_output(boundary: int, states: TargetStates) -> torch.Tensor:
            return states.inputs[min(boundary + 1, len(states.inputs) - 1)]

        self._engine.take_state = layer_output  # type: ignore[method-assign]


_oracle = committed_oracle


def _diagnose(engine: Any, draft: str, convention: str | Any | None,
              prompts: Sequence[Sequence[int]]) -> Diagnosis:
    oracle = _oracle()
    spec = oracle.spec(draft)
    with pytest.raises(ConformanceFailure) as failed:
        assert_capture_matches_oracle(
            CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype="float32",
                           engine_name=engine.name, draft=draft, check="addressee",
                           engine_convention=convention),
            features=engine.capture(prompts).features, oracle=oracle, prompts=prompts)
    (diag,) = failed.value.diagnoses
    return diag


def test_a_hook_on_the_layer_output_blames_the_engine_capture_not_the_config() -> None:
    oracle = _oracle()
    draft = "specforge-default"
    spec = oracle.spec(draft)
    engine = TemplateHookOnLayerOutput(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft),
                                       EngineOptions(training_convention=spec.convention))
    try:
        diag = _diagnose(engine, draft, engine.convention, oracle.pinned_prompts[:4])
    finally:
        engine.close()
    assert diag.kind == "offset" and diag.offset == 1, diag.message
    assert diag.engine_boundaries == [b + 1 for b in spec.boundaries], diag.engine_boundaries
    assert diag.to_json()["addressee"] == "engine vendor", (
        f"addressee {diag.to_json()['addressee']!r}, expected 'engine vendor': the config's ids "
        f"{list(spec.layer_ids)} already mean {list(spec.boundaries)} in {engine.convention.name}")
    assert diag.suggested_layer_ids is None, (
        f"suggested ids {diag.suggested_layer_ids}: the config already holds {list(spec.layer_ids)}")
    assert "its hook reads the layer's output, not its input" in diag.message, diag.message
    assert "For the engine vendor:" in diag.message and "Set eagle_aux_hidden_state_layer_ids" not in diag.message
    # the report says whom it addresses: report.json's diagnoses and report.md
    collector = ReportCollector()
    record = collector.check("test_aux_capture.py::test_capture_pinned[specforge-default]",
                             "suites/test_aux_capture.py::test_capture_pinned[specforge-default]",
                             draft, True)
    record.add_diagnosis(diag)
    record.settle("failed", diag.message)
    report = collector.build(engine={"name": engine.name, "version": "template"},
                             bundle={"path": "/b", "name": "tiny", "sha256": "ab" * 32},
                             drafts=[draft], dtype="float32", started=0.0, finished=1.0)
    assert [d["addressee"] for d in report["diagnoses"]] == ["engine vendor"], report["diagnoses"]
    text = render_markdown(report)
    assert "addressed to: engine vendor" in text


def test_ids_in_another_convention_are_the_draft_owners_to_set() -> None:
    """The same shift where the engine reads ids in another convention than the config was
    written in: the template (b = k+1) serving a draft whose ids mean b = k (eagle3-original)
    is fixed by the ids, in the engine's convention, so the draft owner is told to set them."""
    oracle = _oracle()
    draft = "specforge-default"
    spec = oracle.spec(draft)
    engine = TemplateEngine(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft),
                            EngineOptions(training_convention=spec.convention))
    try:
        features = engine.capture(oracle.pinned_prompts[:4]).features
    finally:
        engine.close()
    # the draft's config as its owner wrote it for an engine with b = id: ids [2, 4, 5]
    from harness.diagnosis.capture import diagnose_capture

    golden = [oracle.features(p) for p in oracle.pinned_prompts[:4]]
    trained = [b - 1 for b in spec.boundaries]  # what b = id training fed for ids [1, 3, 4]
    diag = diagnose_capture(features, golden, trained, engine_convention=engine.convention,
                            config_ids=list(spec.layer_ids))
    assert diag.kind == "offset" and diag.offset == 1, diag.message
    assert diag.to_json()["addressee"] == "draft owner", diag.to_json()["addressee"]
    assert diag.suggested_layer_ids == [b - 1 for b in trained], diag.suggested_layer_ids
    assert "For the draft owner: Set eagle_aux_hidden_state_layer_ids" in diag.message, diag.message
