"""The assertion layer's common ground: a capability requirement, an engine crash as a
failure, and the per-token error count the fc and batch judgements share. How a check fails
(`fail`, the reproducer, `Judgement`) is `harness.judgement.verdict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.fingerprint import relative_errors
from harness.engines.base import Capability, Engine
from harness.judgement.verdict import failure
from harness.reports.report import ConformanceFailure


def require(engine: Engine, capability: Capability) -> None:
    """Skip, with the reason printed, what this engine cannot do."""
    if capability not in engine.capabilities:
        pytest.skip(f"{engine.name} does not declare the {capability.value!r} capability")


def crash_failure(crash: BaseException, *, layer_ids: Sequence[int], target_hidden: int,
                  engine_name: str, draft: str, **context: Any) -> ConformanceFailure:
    """An engine that crashed serving the draft failed the check; the crash is diagnosed from
    its message with the draft's own ids (harness.diagnosis.crash; `context`: the engine's
    declared convention, the training boundaries and the layer count, where known)."""
    return failure(str(crash), draft=draft, engine_name=engine_name,
                   diagnoses=[crash_diagnosis(str(crash), layer_ids, target_hidden, **context)])


def worst_tokens(features: Sequence[torch.Tensor], golden: Sequence[torch.Tensor],
                 rtol: float, allowances: Sequence[torch.Tensor] | None = None) -> tuple[int, int, float]:
    """(bad tokens, total tokens, worst relative error): judged per token, because a bug that
    touches a few positions (a rollback, a ragged batch) vanishes in a whole-prompt norm.
    allowances: per prompt a [T] bound (reduced precision's noise allowance) instead of rtol."""
    bad = total = 0
    worst = 0.0
    for i, (x, ref) in enumerate(zip(features, golden, strict=True)):
        err = relative_errors(x, ref)
        bad += int((err > (rtol if allowances is None else allowances[i])).sum())
        total += err.numel()
        worst = max(worst, float(err.max())) if err.numel() else worst
    return bad, total, worst
