"""The throughput consistency gate: measured speedup against the cost model's prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.core.throughput import SpeedupFinding
from harness.core.tolerances import tolerance_for
from harness.diagnosis.record import Diagnosis
from harness.diagnosis.throughput import throughput_diagnosis
from harness.judgement.verdict import Judgement


def judge_speedup_consistent(finding: SpeedupFinding, *, engine_name: str, draft: str,
                             prompts: Sequence[Sequence[int]], check: str,
                             trained_acceptance: float | None = None, dtype: str = "float32",
                             shortfall: Callable[[], Diagnosis] | None = None) -> Judgement:
    """Does speculation deliver the speedup its measured acceptance and per-step costs promise?
    (harness.core.throughput.judge_speedup decides the numbers; this words them and diagnoses.)

    Where the timed run's acceptance is itself below training's (`trained_acceptance`: the
    golden traces' on the same prompts) by more than the dtype's prediction margin (the bound
    the held-out acceptance check uses), a speculation that does not pay is first of all an
    acceptance problem (the motivating user's case): the failure is diagnosed by `shortfall`
    (the acceptance explainer), never as serving overhead."""
    where = {"draft": draft, "engine_name": engine_name, "prompts": prompts, "check": check}
    measured = {"measured_speedup": finding.measured, "acceptance_length": finding.acceptance_length}
    if finding.failure is None:
        return Judgement(True, "speculation pays as its acceptance and step costs predict",
                         measured=measured, bound=finding.predicted, **where)
    margin = tolerance_for(dtype).prediction_margin
    if (shortfall is not None and trained_acceptance is not None
            and finding.acceptance_length < trained_acceptance * (1 - margin)):
        diag = shortfall()
        return Judgement(False, f"{finding.failure}; the timed run's acceptance length "
                                f"{finding.acceptance_length:.3f} is more than {margin:.0%} below "
                                f"training's {trained_acceptance:.3f} on the same prompts, so the "
                                f"acceptance, not the serving loop, is what costs the speedup: "
                                f"{diag.message}",
                         measured=measured, bound=finding.predicted, diagnosis=diag, **where)
    diag = throughput_diagnosis(finding.failure, finding.dominant,
                                measured_speedup=finding.measured,
                                predicted_speedup=finding.predicted,
                                acceptance_length=finding.acceptance_length,
                                dominant_share=finding.dominant_share)
    return Judgement(False, diag.message, measured=measured, bound=finding.predicted, diagnosis=diag,
                     **where)


def assert_speedup_consistent(finding: SpeedupFinding, **judged: Any) -> None:
    """`judge_speedup_consistent`, raised."""
    judge_speedup_consistent(finding, **judged).verdict()
