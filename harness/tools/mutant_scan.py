"""Zoo mutants judged on one draft's pinned batch the way the capture check judges them (one
batch, each prompt alone as the batch evidence), without a suite run: the diagnosis map of
benchmarks/diagnosis_scan.py and the precision tests' named cases share it.

Drafts are the bundle's four and, for the layer-id check's draws, factory drafts
(harness.golden.draft_factory) of every single boundary SpecForge's ids can name and a few
lists of two and three: single slots are where reduced precision leaves the least evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.core.boundaries import boundaries_to_ids, get_convention
from harness.diagnosis.record import Diagnosis
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.draft_factory import DraftFactory
from harness.golden.oracle import Oracle
from harness.judgement.assertions import CaptureContext, judge_capture_oracle


@dataclass(frozen=True)
class Served:
    """A draft to serve: its folder, the convention its ids follow, and what training fed."""

    name: str
    folder: Path
    convention: str
    layer_ids: tuple[int, ...]
    boundaries: tuple[int, ...]


def bundle_drafts(oracle: Oracle) -> list[Served]:
    bundle = oracle.bundle
    return [Served(name, bundle.draft_dir(name), bundle.draft(name).convention,
                   tuple(oracle.spec(name).layer_ids), tuple(oracle.spec(name).boundaries))
            for name in bundle.draft_names]


def factory_drafts(oracle: Oracle, scratch: Path,
                   lists: Sequence[Sequence[int]] | None = None) -> list[Served]:
    """Drafts whose SpecForge ids name these boundary lists; by default every single boundary
    SpecForge's ids name, then a few lists of two and three."""
    n, conv = oracle.bundle.num_layers, get_convention("specforge")
    if lists is None:
        singles = [(b,) for b in range(n + 1) if conv.can_capture(b, n)]
        lists = [*singles, (1, n), (2, n // 2), (n // 2, n - 1), (1, n // 2, n), (3, 2, 6)]
    factory = DraftFactory(oracle.bundle, scratch)
    out = []
    for bounds in lists:
        ids = tuple(boundaries_to_ids(list(bounds), conv, n))
        out.append(Served(f"ids {list(ids)}", factory.folder(ids), conv.name, ids, bounds))
    return out


def _engine(oracle: Oracle, cls: type[ReferenceEngine], draft: Served, dtype: str) -> ReferenceEngine:
    return cls(oracle.bundle.target_dir, draft.folder,
               EngineOptions(dtype=dtype, training_convention=draft.convention))


def same_capture(oracle: Oracle, a: type[ReferenceEngine], b: type[ReferenceEngine], draft: Served,
                 dtype: str) -> bool:
    """Whether two engines hand this draft bit-identical features on the pinned batch: then no
    evidence can tell their bugs apart on it ([8] alone: a never-captured final boundary and
    a skipped last MoE layer both leave one zero slot)."""
    try:
        x, y = (_engine(oracle, c, draft, dtype).capture(oracle.pinned_prompts).features for c in (a, b))
    except RuntimeError:
        return False
    return all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(x, y, strict=True))


def judge(oracle: Oracle, cls: type[ReferenceEngine], draft: Served, dtype: str) -> str:
    """PASS, the diagnosis kind of the failure, or CRASH: <first line>."""
    return named(oracle, cls, draft, dtype)[0]


def named(oracle: Oracle, cls: type[ReferenceEngine], draft: Served, dtype: str) -> tuple[str, str]:
    """(`judge`'s answer, the failure's message: the evidence a test prints)."""
    answer, _, message = diagnosed(oracle, cls, draft, dtype)
    return answer, message


def confidence(diag: Diagnosis | None) -> tuple[float | None, str | None, bool]:
    """(the margin printed, the runner-up named, whether the diagnosis says it is ambiguous)
    of a diagnosis (issue #31): a wrong kind is "confidently wrong" only when not ambiguous."""
    if diag is None:
        return None, None, False
    comparison = diag.details.get("comparison") or {}
    ambiguous = "ambiguous_with" in diag.details or "Ambiguous between" in diag.message
    return diag.details.get("confidence_margin"), comparison.get("runner_up"), ambiguous


def diagnosed(oracle: Oracle, cls: type[ReferenceEngine], draft: Served,
              dtype: str) -> tuple[str, Diagnosis | None, str]:
    """(`judge`'s answer, the failure's diagnosis where there is one, its message)."""
    engine = _engine(oracle, cls, draft, dtype)
    prompts = oracle.pinned_prompts
    try:
        features = engine.capture(prompts).features
    except RuntimeError as crash:
        return f"CRASH: {str(crash).splitlines()[0][:80]}", None, str(crash)
    ctx = CaptureContext(training_boundaries=list(draft.boundaries), config_ids=list(draft.layer_ids),
                         dtype=dtype, engine_name=cls.name, draft=draft.name, check="mutant_scan",
                         engine_convention=engine.convention, in_batch=True,
                         alone=lambda some: [engine.capture([p]).features[0] for p in some])
    judged = judge_capture_oracle(ctx, features=features, oracle=oracle, prompts=prompts)
    if judged.failure is None:
        return "PASS", None, ""
    diag = judged.diagnoses[0] if judged.diagnoses else None
    return (diag.kind if diag is not None else "no diagnosis"), diag, str(judged.failure)
