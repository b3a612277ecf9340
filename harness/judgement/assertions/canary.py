"""The canary's verdict: an engine's own acceptance counters against the line the bundle drew."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.core.tolerances import CANARY_FRACTION
from harness.judgement.verdict import Judgement


def canary_line(canary: dict, same_dtype: float | None = None) -> float | None:
    """The acceptance length the engine must reach on the canary prompts.

    fp32 (`same_dtype` None): the bundle's line, CANARY_FRACTION of the way from the best
    wrong wiring's acceptance there up to the acceptance served as trained. Reduced precision:
    the served side is the lower of fp32's and the reference engine's own in the engine's
    dtype on its device (precision noise of a correct engine is not a wiring bug: the canary
    prompts were picked in fp32 for their gap, and reduced precision may give some of it
    back), the line drawn the same fraction of the way. None where that reference itself is
    no better than the best wrong wiring: in that dtype the canary cannot tell them apart."""
    wrong = float(canary["best_wrong"])
    served = float(canary["served"]) if same_dtype is None else min(float(canary["served"]), same_dtype)
    if served <= wrong:
        return None
    return float(canary["threshold"]) if same_dtype is None else wrong + CANARY_FRACTION * (served - wrong)


def judge_canary(measured: float, canary: dict, *, engine_name: str, draft: str,
                 prompts: Sequence[Sequence[int]], same_dtype: float | None = None) -> Judgement:
    """The canary: served on the bundle's canary prompts, does the engine's mean acceptance
    length (its own counters, nothing else) reach `canary_line`
    (`harness.core.tolerances.CANARY_REASON`)? The caller skips where the line is None (no line
    in this dtype)."""
    line = canary_line(canary, same_dtype)
    if line is None:
        raise ValueError("no canary line in this dtype: skip the check (canary_line is None)")
    where = {"draft": draft, "engine_name": engine_name, "prompts": prompts}
    if measured >= line:
        return Judgement(True, f"canary: mean acceptance length {measured:.3f} reaches the line {line:.3f}",
                         measured=measured, bound=line, **where)
    own = "" if same_dtype is None else (f"; the reference engine itself serves {same_dtype:.3f} "
                                         f"there in this dtype, so the line sits {CANARY_FRACTION:.0%} "
                                         f"of the way from the best wrong wiring to the lower of the two")
    return Judgement(
        False, f"canary: mean acceptance length {measured:.3f} on the {len(prompts)} canary prompts is "
               f"below the line {line:.3f}: training's wiring serves {float(canary['served']):.3f} there "
               f"in fp32, the best wrong wiring the bundle measured ({canary['best_wrong_wiring']}) "
               f"{float(canary['best_wrong']):.3f}{own}. The engine feeds the draft other states than it "
               f"was trained on (or drafts from them wrongly); run the capture checks where the engine "
               f"exposes its aux states, or `eagle3-conformance doctor`, to name the wiring",
        measured=measured, bound=line, **where)


def assert_canary_accepts(measured: float, canary: dict, **judged: Any) -> None:
    """`judge_canary`, raised."""
    judge_canary(measured, canary, **judged).verdict()
