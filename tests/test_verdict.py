"""One place decides pass/fail (issue #34, item 2): a judge function returns a `Judgement`
whose diagnosis is computed once, whatever asks for it afterwards, and the raising helpers
raise exactly that judgement's failure."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from golden_oracle import committed_oracle

import harness.judgement.assertions.capture as capture
from harness.diagnosis.record import Diagnosis
from harness.golden.features import aux_features
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches_oracle,
    judge_capture_oracle,
)
from harness.judgement.verdict import Judgement


def _diag(kind: str) -> Diagnosis:
    return Diagnosis(kind=kind, message=f"{kind} seen", engine_boundaries=[], training_boundaries=[],
                     suggested_layer_ids=None)


def test_a_failed_judgement_builds_its_failure_once() -> None:
    judged = Judgement(False, "off by one", diagnosis=_diag("offset"), draft="d", engine_name="e",
                       prompts=[[1, 2]], check="c")
    assert judged.failure is judged.failure  # one reproducer, one diagnosis list
    assert str(judged.failure).startswith("off by one\nreproduce: eagle3-conformance run")
    assert judged.diagnoses == [judged.diagnosis]
    with pytest.raises(ConformanceFailure) as raised:
        judged.verdict()
    assert raised.value is judged.failure


def test_an_ok_diagnosis_on_a_failure_reads_unrecognised_and_a_pass_raises_nothing() -> None:
    failed = Judgement(False, "beyond the bound", diagnosis=_diag("ok"), draft="d")
    assert [d.kind for d in failed.diagnoses] == ["unrecognised"]
    passed = Judgement(True, "as trained", diagnosis=_diag("ok"))
    assert passed.failure is None and passed.verdict() is passed.diagnosis


def test_a_judgement_without_reproducer_keeps_its_text() -> None:
    """A failure before any comparison (non-finite values), or one wrapping a failure that
    already ends with its reproducer (the decode check's prefill), adds none."""
    judged = Judgement(False, "NaN in the features", diagnosis=_diag("non_finite"), reproduce=False)
    assert str(judged.failure) == "NaN in the features"


def _context(**evidence: Any) -> CaptureContext:
    spec = committed_oracle().bundle.draft("specforge-default")
    return CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids,
                          dtype="float32", engine_name="test", draft="specforge-default",
                          check="test_verdict", **evidence)


def _one_boundary_early(prompts: list[list[int]]) -> list[torch.Tensor]:
    oracle = committed_oracle()
    spec = oracle.bundle.draft("specforge-default")
    return [aux_features(oracle.features(p), [b - 1 for b in spec.boundaries]) for p in prompts]


def test_a_failed_capture_is_diagnosed_once_on_all_its_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict first, then one diagnosis that reads the context's extra prompts and the solo
    captures; before, a failure was diagnosed on its own rows, again with the extra prompts and
    a third time with the solo captures."""
    oracle = committed_oracle()
    prompts = sorted(oracle.pinned_prompts, key=len)[-2:]
    calls: list[int] = []
    real = capture.diagnose_capture

    def counted(*args: Any, **kwargs: Any) -> Diagnosis:
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(capture, "diagnose_capture", counted)
    more = oracle.pinned_prompts[:2]
    ctx = _context(more_evidence=lambda: (more, _one_boundary_early(more), [oracle.features(p) for p in more]),
                   alone=_one_boundary_early)
    judged = judge_capture_oracle(ctx, features=_one_boundary_early(prompts), oracle=oracle, prompts=prompts)
    assert not judged.passed and judged.diagnosis is not None and judged.diagnosis.kind == "offset"
    assert calls == [len(prompts) + len(more)], calls
    assert judged.diagnoses == [judged.diagnosis]
    with pytest.raises(ConformanceFailure) as raised:
        assert_capture_matches_oracle(ctx, features=_one_boundary_early(prompts), oracle=oracle,
                                      prompts=prompts)
    assert str(raised.value).startswith("aux features differ from training on ")
    assert [d.kind for d in raised.value.diagnoses] == ["offset"]


def test_a_capture_as_trained_is_diagnosed_once_and_passes() -> None:
    oracle = committed_oracle()
    prompts = sorted(oracle.pinned_prompts, key=len)[-2:]
    spec = oracle.bundle.draft("specforge-default")
    fed = [aux_features(oracle.features(p), spec.boundaries) for p in prompts]
    judged = judge_capture_oracle(_context(), features=fed, oracle=oracle, prompts=prompts)
    assert judged.passed and judged.diagnosis is not None and judged.diagnosis.kind == "ok"
    assert judged.measured["tokens_off"] == 0 and "summation order" in judged.bound
