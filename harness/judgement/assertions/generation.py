"""Greedy divergence between two generations, excused only at a near-tie of the target's
logits that precision can flip.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.core.tolerances import tolerance_for
from harness.judgement.precision import is_reduced


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_bound(oracle, context: Sequence[int], pair: Sequence[int], dtype: str,
                   device: str = "cpu") -> tuple[float, float]:
    """(fp32 logit gap between the two tokens of `pair` after `context`, the gap `dtype` on
    `device` may flip): fp32 excuses summation order only; reduced precision adds what the
    same-dtype reference's logits of those two tokens actually moved, noise_factor times, and
    the rounding of the logits themselves (harness.core.tolerances.REASONS['near_tie'])."""
    tol = tolerance_for(dtype)
    logits, _ = oracle.top2_logits(context)
    idx = torch.tensor(list(pair))
    gap = float((logits[idx[0]] - logits[idx[1]]).abs())
    bound = tol.near_tie
    if is_reduced(dtype):
        low = oracle.reference_logits(context, dtype, device)
        moved = float((low[idx] - logits[idx]).abs().sum())
        bound = max(bound, tol.noise_factor * moved + 2 * tol.unit * float(logits[idx].abs().max()))
    return gap, bound


def divergence(oracle, prompt: Sequence[int], got: Sequence[int], want: Sequence[int],
               dtype: str, device: str = "cpu") -> tuple[bool, str | None]:
    """(excused near-tie?, failure text or None) for two greedy continuations of `prompt`."""
    j = first_divergence(got, want)
    if j is None:
        return False, None
    if j >= min(len(got), len(want)):
        return False, f"prompt {list(prompt)}: lengths differ ({len(got)} vs {len(want)} tokens)"
    gap, bound = near_tie_bound(oracle, list(prompt) + list(want[:j]), (got[j], want[j]), dtype, device)
    if gap <= bound:
        return True, None
    return False, (f"prompt {list(prompt)}: token {j} is {got[j]} vs {want[j]} (fp32 logit gap "
                   f"{gap:.3g} > near-tie bound {bound:.3g} for {dtype} on {device})")

