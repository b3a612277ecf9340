"""Slot fingerprinting: what each engine slot holds, token by token, among every golden
boundary and the states engines hand over by mistake (boundary N after the final norm, an MLP
output without its residual, zeros).

Token-level matching, not a whole-tensor distance, is what makes this robust: an engine that
skips capture on some layers or positions leaves a slot that is right on some tokens and stale
elsewhere, and a whole-tensor distance would call it "no match". Distances are relative per
token, so a bf16 engine matches at a bf16 tolerance.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from harness.diagnosis.record import AMBIGUOUS, FINAL_NORMED, ZERO, Label, SlotMatch, mlp_label
from harness.golden.features import TargetFeatures, relative_errors  # noqa: F401 - re-exported: the measure every diagnosis uses

# An error beyond this is "nothing alike" (a zero or garbage slot gives inf per token): capped,
# so one such token cannot swamp a slot's mean error to a boundary in the report's heatmap.
_ERROR_CAP = 10.0


def candidates(golden: TargetFeatures) -> tuple[list[Label], torch.Tensor]:
    """Every state an engine could plausibly hand the draft, stacked [C, T, H]."""
    n = golden.num_layers
    labels: list[Label] = list(range(n + 1)) + [FINAL_NORMED] + [mlp_label(k) for k in range(1, n + 1)]
    states = torch.cat([golden.boundaries.float(), golden.final_normed.float()[None],
                        golden.mlp_out[1:].float()], dim=0)
    return labels, states


def _identified(err: torch.Tensor, labels: list[Label], separation: float,
                expected: int | None) -> tuple[list[Label], list[bool]]:
    """Reduced precision (separation > 0): per token, the label of the state it is identified
    as (nearest candidate, every other `separation` times farther, nearer than zero), None
    where it is no nearer any state than zero is (garbage, stale), else AMBIGUOUS; and whether
    the token is consistent with the expected boundary (identified as it, or ambiguous with it
    within the separation band of the nearest: precision cannot tell it from the expected
    state, which is no evidence against it). fp32: no labels (None), nothing consistent."""
    t_count = err.shape[1]
    if separation <= 0:
        return [None] * t_count, [False] * t_count
    two = err.topk(2, dim=0, largest=False)
    best, second, idx = two.values[0], two.values[1], two.indices[0]
    own = err[labels.index(expected)] if expected is not None else None
    out: list[Label] = []
    consistent: list[bool] = []
    for t in range(t_count):
        b, s, lab = float(best[t]), float(second[t]), labels[int(idx[t])]
        if b >= 1.0:
            out.append(None)
        elif s >= separation * b:
            out.append(lab)
        else:
            out.append(AMBIGUOUS)
        in_band = own is not None and b < 1.0 and float(own[t]) <= separation * b
        consistent.append(out[-1] == expected or (out[-1] == AMBIGUOUS and in_band))
    return out, consistent


def _match_slot(slot: int, chunks: list[torch.Tensor], golden: Sequence[TargetFeatures],
                expected: int | None, rtol: float, separation: float) -> SlotMatch:
    counts: Counter[Label] = Counter()
    in_tol = telling = zeros = total = 0
    boundary_err_sum: torch.Tensor | None = None  # [N+1]: summed per-token error to each boundary
    diff_sq = ref_sq = dot = x_sq = 0.0
    reduced = separation > 0
    for x, gold in zip(chunks, golden, strict=True):
        labels, states = candidates(gold)
        err = relative_errors(x[None], states)  # [C, T]
        per_boundary = err[:gold.num_layers + 1].clamp_max(_ERROR_CAP).sum(dim=1)
        boundary_err_sum = per_boundary if boundary_err_sum is None else boundary_err_sum + per_boundary
        x_norm = x.norm(dim=-1)
        tiny = 1e-6 * gold.boundaries.norm(dim=-1).mean(0)  # [T]: "zero" at this token's scale
        is_zero = x_norm <= tiny
        best_err, best = err.min(dim=0)
        identified, consistent = _identified(err, labels, separation, expected)
        for t in range(x.shape[0]):
            if reduced:
                # identity decides in reduced precision: a token within rtol of a state that
                # another state is nearly as near to says nothing about which one it is
                counts[ZERO if is_zero[t] and best_err[t] > rtol else identified[t]] += 1
            elif best_err[t] <= rtol:  # before the zero test: a pad token's embedding is zero
                counts[labels[int(best[t])]] += 1
            elif is_zero[t]:
                counts[ZERO] += 1
            else:
                counts[identified[t]] += 1
        zeros += int(is_zero.sum())
        total += x.shape[0]
        if expected is not None:
            ref = gold.boundaries[expected].float()
            hit = (torch.tensor(consistent, dtype=torch.bool) & ~(is_zero & (best_err > rtol))
                   if reduced else err[expected] <= rtol)
            in_tol += int(hit.sum())
            telling += int((hit & (ref.norm(dim=-1) > tiny)).sum())
            diff_sq += float(((x - ref) ** 2).sum())
            ref_sq += float((ref ** 2).sum())
            dot += float((x * ref).sum())
            x_sq += float((x ** 2).sum())
    # the slot holds what its decidable tokens are; ambiguous tokens are evidence of nothing
    decided = Counter({k: v for k, v in counts.items() if k != AMBIGUOUS}) or counts
    found, hits = decided.most_common(1)[0]
    nan = float("nan")
    rel = math.sqrt(diff_sq / ref_sq) if expected is not None and ref_sq > 0 else nan
    cos = dot / math.sqrt(x_sq * ref_sq) if expected is not None and x_sq * ref_sq > 0 else nan
    return SlotMatch(slot=slot, expected=expected, found=found,
                     match_fraction=hits / max(sum(decided.values()), 1),
                     expected_fraction=in_tol / total if expected is not None else 0.0,
                     zero_fraction=zeros / total, rel_error=rel, cosine=cos,
                     telling_hits=telling, token_labels=counts,
                     boundary_errors=[] if boundary_err_sum is None else
                     [round(float(e) / total, 4) for e in boundary_err_sum])


def fingerprint(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                training_boundaries: Sequence[int], rtol: float,
                separation: float = 0.0) -> list[SlotMatch]:
    """Match every engine slot (H-wide chunk of the features) against the golden states. A
    token beyond rtol is still labelled with the state it is identified as when `separation`
    > 0 (reduced precision: see harness.core.tolerances.REASONS['separation']), so precision noise
    never reads as "matches nothing"."""
    if len(features) != len(golden) or not features:
        raise ValueError(f"got features for {len(features)} prompts and golden data for "
                         f"{len(golden)}; pass one of each per prompt")
    hidden = golden[0].boundaries.shape[-1]
    width = features[0].shape[-1]
    if width % hidden:
        raise ValueError(f"feature width {width} is not a multiple of the target hidden size {hidden}")
    for p, (x, g) in enumerate(zip(features, golden, strict=True)):
        if x.shape[0] != g.boundaries.shape[1] or x.shape[-1] != width:
            raise ValueError(f"prompt {p}: engine features {tuple(x.shape)} do not line up with "
                             f"{g.boundaries.shape[1]} golden tokens of width {width}; "
                             f"return one row per prompt token")
    slots = []
    for s in range(width // hidden):
        chunks = [x.float()[:, s * hidden:(s + 1) * hidden] for x in features]
        expected = training_boundaries[s] if s < len(training_boundaries) else None
        slots.append(_match_slot(s, chunks, golden, expected, rtol, separation))
    return slots
