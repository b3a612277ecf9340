"""The canary's verdict: an engine's own acceptance counters against the line the bundle drew."""

from __future__ import annotations

from collections.abc import Sequence

from harness.assertions.base import fail


def assert_canary_accepts(measured: float, canary: dict, *, engine_name: str, draft: str,
                          prompts: Sequence[Sequence[int]]) -> None:
    """The canary: served on the bundle's canary prompts, the engine's mean acceptance length
    (its own counters, nothing else) reaches the line the bundle drew between serving as
    trained and the best wrong wiring it measured there (`harness.tolerances.CANARY_REASON`)."""
    line = float(canary["threshold"])
    if measured >= line:
        return
    fail(f"canary: mean acceptance length {measured:.3f} on the {len(prompts)} canary prompts is "
         f"below the line {line:.3f}: training's wiring serves {float(canary['served']):.3f} there, "
         f"the best wrong wiring the bundle measured ({canary['best_wrong_wiring']}) "
         f"{float(canary['best_wrong']):.3f}. The engine feeds the draft other states than it "
         f"was trained on (or drafts from them wrongly); run the capture checks where the engine "
         f"exposes its aux states, or `eagle3-conformance doctor`, to name the wiring",
         draft=draft, engine_name=engine_name, prompts=prompts)
