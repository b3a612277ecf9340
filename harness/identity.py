"""Which golden boundary each engine slot holds, by nearest state, with the margin that
separates it from the runner-up.

A per-token error bound cannot judge capture at depth in reduced precision: on a 61-layer
DeepSeek-V3-shaped target in bf16 the per-token error against fp32 grows past the distance
between adjacent boundaries, yet each bf16 state stays nearest to its own fp32 boundary.
Identity by nearest state asks the question a wiring bug changes (which boundary is this?),
and the separation ratio (distance to the runner-up over distance to the nearest, per token)
says how sure that answer is: near 1, two boundaries are equally near and the slot is
ambiguous, which is reported as such rather than named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SlotIdentity:
    slot: int
    nearest: Counter[int]  # boundary -> tokens nearest to it
    modal: int  # the boundary most tokens are nearest to
    share: float  # share of tokens nearest to `modal`
    median_error: float  # relative error to `modal`, median over tokens
    min_separation: float  # over tokens: runner-up distance / nearest distance (>= 1)
    median_separation: float

    @property
    def unanimous(self) -> bool:
        return self.share == 1.0

    def to_json(self) -> dict[str, Any]:
        return {"slot": self.slot, "modal": self.modal, "share": self.share,
                "median_error": self.median_error, "min_separation": self.min_separation,
                "median_separation": self.median_separation,
                "nearest": {str(k): v for k, v in sorted(self.nearest.items())}}


def identify_slots(features: torch.Tensor, boundaries: torch.Tensor) -> list[SlotIdentity]:
    """features [T, n*H] (one prompt, engine slot order); boundaries [N+1, T, H] the golden
    residual stream of the same prompt. Distances are relative to each candidate's norm, the
    measure every comparison of the suite uses."""
    hidden = boundaries.shape[-1]
    if features.shape[-1] % hidden or features.shape[0] != boundaries.shape[1]:
        raise ValueError(f"features {tuple(features.shape)} do not line up with boundaries "
                         f"{tuple(boundaries.shape)}: expect [T, n*H] against [N+1, T, H]")
    ref = boundaries.float()
    out = []
    for s in range(features.shape[-1] // hidden):
        x = features[:, s * hidden:(s + 1) * hidden].float().to(ref.device)
        err = (x[None] - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)  # [N+1, T]
        two = err.topk(2, dim=0, largest=False)
        best, second = two.values[0], two.values[1]
        labels = two.indices[0].tolist()
        counts = Counter(int(b) for b in labels)
        modal, hits = counts.most_common(1)[0]
        sep = second / best.clamp_min(1e-12)
        out.append(SlotIdentity(slot=s, nearest=counts, modal=modal, share=hits / len(labels),
                                median_error=float(err[modal].median()),
                                min_separation=float(sep.min()),
                                median_separation=float(sep.median())))
    return out
