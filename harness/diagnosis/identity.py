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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.diagnosis.fingerprint import candidates, relative_errors
from harness.diagnosis.record import Label
from harness.golden.features import TargetFeatures


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


# -- token by token, for the reduced-precision judgement ------------------------------------

EXACT, OUTLIER, AMBIGUOUS, WRONG = "exact", "precision_outlier", "ambiguous", "wrong"
TOKEN_CLASSES = (EXACT, OUTLIER, AMBIGUOUS, WRONG)


@dataclass(frozen=True)
class TokenClasses:
    """What each token of one slot (one prompt) is, for an engine computing in reduced
    precision: `exact` within the noise allowance and nearest its own boundary;
    `precision_outlier` beyond it but clearly its own boundary (a routing near-tie the
    same-dtype reference rounded the other way); `ambiguous` beyond it and not clearly any
    state: precision cannot tell; `wrong` what a wiring bug leaves: clearly another golden
    state, zeros, or a state no nearer its boundary than zero is (stale)."""

    classes: list[str]  # per token, one of TOKEN_CLASSES
    errors: torch.Tensor  # [T] relative error to the expected boundary
    allowance: torch.Tensor  # [T] noise allowance (noise_factor x the same-dtype reference's error)
    nearest_other: list[Label]  # per token, the nearest candidate other than the expected one

    def count(self, cls: str) -> int:
        return sum(c == cls for c in self.classes)

    def tokens(self, cls: str) -> list[int]:
        return [t for t, c in enumerate(self.classes) if c == cls]


def noise_allowance(noise: torch.Tensor, *, noise_factor: float, floor: float) -> torch.Tensor:
    """[T] the error a correct engine may show per token: noise_factor times the same-dtype
    reference's error at that token, or at the median token where it rounded luckily, and
    never below `floor` (harness.tolerances.REASONS['noise_factor'])."""
    if noise.numel() == 0:
        return noise
    return torch.clamp_min(noise_factor * torch.maximum(noise, noise.median()), floor)


def classify_tokens(x: torch.Tensor, golden: TargetFeatures, expected: int,
                    same_dtype: torch.Tensor, *, noise_factor: float, separation: float,
                    floor: float) -> TokenClasses:
    """x [T, H]: one slot of one prompt; golden: its fp32 training features; same_dtype
    [T, H]: the reference computation's state at this boundary in the engine's dtype on its
    device, whose error is the noise floor; floor: the least allowance (the fp32 bound). A
    token where that reference itself is not identified as its boundary is one precision
    cannot decide: ambiguous unless the engine left zeros there. See
    harness.tolerances.REASONS['noise_factor'] and ['separation'] for the bounds."""
    labels, states = candidates(golden)
    own = states[expected]
    # candidates equal to the expected state (a pad token's embedding row) cannot tell it
    # apart from itself
    same = relative_errors(own[None], states) <= 1e-6
    same[expected] = True

    def distances(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        err = relative_errors(state[None].float(), states)  # [C, T]
        d_alt, alt = err.masked_fill(same, float("inf")).min(dim=0)
        return err[expected], d_alt, alt

    d_own, d_alt, alt = distances(x)
    r_own, r_alt, _ = distances(same_dtype)
    allowance = noise_allowance(r_own, noise_factor=noise_factor, floor=floor)
    tiny = 1e-6 * golden.boundaries.norm(dim=-1).mean(0)  # [T]: "zero" at this token's scale
    is_zero = x.float().norm(dim=-1) <= tiny
    own_zero = own.norm(dim=-1) <= tiny
    undecidable = (r_own >= 1.0) | ((r_own > separation * r_alt) & (r_own > floor))
    clearly_other = d_own >= separation * d_alt
    clearly_own = d_alt >= separation * d_own
    out = []
    for t in range(x.shape[0]):
        if own_zero[t]:
            out.append(EXACT if is_zero[t] or d_own[t] <= allowance[t] else WRONG)
        elif is_zero[t]:
            out.append(WRONG)
        elif undecidable[t]:
            out.append(AMBIGUOUS)
        elif clearly_other[t] or d_own[t] >= 1.0:
            out.append(WRONG)
        elif d_own[t] <= allowance[t]:
            out.append(EXACT)
        elif clearly_own[t]:
            out.append(OUTLIER)
        else:
            out.append(AMBIGUOUS)
    return TokenClasses(classes=out, errors=d_own, allowance=allowance,
                        nearest_other=[labels[int(i)] for i in alt])


@dataclass
class PrecisionFinding:
    """Token classes of every slot over a batch of prompts, in reduced precision: the counts a
    report shows, the tokens a failure names, and the slots whose typical error drifts beyond
    the noise floor (a bug that moves every token a little, which identity alone misses)."""

    counts: dict[str, int]  # class -> tokens (over slots and prompts)
    wrong: list[tuple[int, int, int, str]]  # (prompt, slot, token, why)
    ambiguous: list[tuple[int, int, int]]  # (prompt, slot, token)
    drift: list[tuple[int, float, float]]  # (slot, median error, median allowance)
    worst: float
    tokens: int

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.drift

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, **self.counts, "worst_rel_error": round(self.worst, 4),
                "ambiguous_at": [list(a) for a in self.ambiguous[:20]],
                "drifting_slots": [s for s, _, _ in self.drift]}


def classify_capture(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                     training_boundaries: Sequence[int], noise: Sequence[TargetFeatures], *,
                     noise_factor: float, separation: float, floor: float) -> PrecisionFinding:
    """Classify every token of every slot (see `classify_tokens`); noise: per prompt, the
    features of the reference computation in the engine's dtype on its device."""
    hidden = golden[0].boundaries.shape[-1]
    counts = dict.fromkeys(TOKEN_CLASSES, 0)
    wrong: list[tuple[int, int, int, str]] = []
    ambiguous: list[tuple[int, int, int]] = []
    per_slot_err: dict[int, list[torch.Tensor]] = {}
    per_slot_noise: dict[int, list[torch.Tensor]] = {}
    worst, tokens = 0.0, 0
    for p, (x, g, ref) in enumerate(zip(features, golden, noise, strict=True)):
        for s, b in enumerate(training_boundaries):
            chunk = x[:, s * hidden:(s + 1) * hidden].float()
            floor_t = relative_errors(ref.boundaries[b], g.boundaries[b])
            tc = classify_tokens(chunk, g, b, ref.boundaries[b], noise_factor=noise_factor,
                                 separation=separation, floor=floor)
            for cls in TOKEN_CLASSES:
                counts[cls] += tc.count(cls)
            for t in tc.tokens(WRONG):
                wrong.append((p, s, t, f"error {float(tc.errors[t]):.3g} to boundary {b}, "
                                       f"nearest other {tc.nearest_other[t]}"))
            ambiguous += [(p, s, t) for t in tc.tokens(AMBIGUOUS)]
            per_slot_err.setdefault(s, []).append(tc.errors)
            per_slot_noise.setdefault(s, []).append(floor_t)
            worst = max(worst, float(tc.errors.max()))
            tokens += chunk.shape[0]
    drift = []
    for s, errs in per_slot_err.items():
        med = float(torch.cat(errs).median())
        allowed = max(floor, noise_factor * float(torch.cat(per_slot_noise[s]).median()))
        if med > allowed:
            drift.append((s, med, allowed))
    return PrecisionFinding(counts=counts, wrong=wrong, ambiguous=ambiguous, drift=drift,
                            worst=worst, tokens=tokens)
