"""The throughput kind: speculation that does not pay what its measured acceptance and the
engine's own per-step costs promise (harness.core.throughput judges the numbers). The wiring may be
right (the capture and acceptance checks say so); the serving loop around it is not.
"""

from __future__ import annotations

from typing import Any

from harness.diagnosis.record import Diagnosis

_FIX = {
    "serving_loop": "cut the per-round host work: CUDA graphs for the draft steps, no host sync "
                    "between draft and verify, batched cache bookkeeping",
    "verify": "the target's verify forward of k + 1 tokens costs too much against a plain step: "
              "a kernel that does not batch the k + 1 tokens, or k too large",
    "draft_steps": "the draft steps cost too much against a target step: an unfused or "
                   "uncompiled draft, or k too large for this draft",
    "draft_feed": "re-feeding the accepted positions to the draft costs too much",
}


def throughput_diagnosis(failure: str, dominant: str, **details: Any) -> Diagnosis:
    """`failure`: the gate's finding with both numbers; `dominant`: the largest cost of a
    measured round (a key of harness.core.throughput.StepCosts.components, or serving_loop)."""
    return Diagnosis(kind="speculation_overhead",
                     message=f"{failure}; root cause: speculation overhead — {_FIX[dominant]}.",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
                     details={"dominant_cost": dominant, **details})
