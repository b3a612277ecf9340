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
from dataclasses import field as dataclass_field
from typing import Any

import torch

from harness.core.tolerances import DRIFT_MIN_TOKENS
from harness.diagnosis.fingerprint import candidates, relative_errors
from harness.diagnosis.record import Label
from harness.golden.envelope import Envelope
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

EXACT, OUTLIER, AMBIGUOUS, ROUTING_TIE, WRONG = (
    "exact", "precision_outlier", "ambiguous", "routing_tie", "wrong")
TOKEN_CLASSES = (EXACT, OUTLIER, AMBIGUOUS, ROUTING_TIE, WRONG)


@dataclass(frozen=True)
class TokenClasses:
    """What each token of one slot (one prompt) is, for an engine computing in reduced
    precision: `exact` within the envelope's allowance and nearest its own boundary;
    `precision_outlier` beyond it but clearly its own boundary; `ambiguous` beyond it and not
    clearly any state, or a token some correct implementation itself cannot identify:
    precision cannot tell; `routing_tie` beyond the allowance at a token whose MoE routing
    correct implementations do not agree on (harness/golden/envelope.py): a swapped expert
    moves it as far as a wiring bug would, so it is evidence of neither; `wrong` what a wiring
    bug leaves: clearly another golden state, zeros, or a state no nearer its boundary than
    zero is (stale)."""

    classes: list[str]  # per token, one of TOKEN_CLASSES
    errors: torch.Tensor  # [T] relative error to the expected boundary
    allowance: torch.Tensor  # [T] noise allowance (noise_factor x the envelope's error)
    nearest_other: list[Label]  # per token, the nearest candidate other than the expected one

    def count(self, cls: str) -> int:
        return sum(c == cls for c in self.classes)

    def tokens(self, cls: str) -> list[int]:
        return [t for t, c in enumerate(self.classes) if c == cls]


def noise_allowance(noise: torch.Tensor, *, noise_factor: float, floor: float) -> torch.Tensor:
    """[T] the error a correct engine may show per token: noise_factor times the envelope's
    error at that token (the largest any correct implementation makes), or at the median token
    where every member rounded luckily, and never below `floor`
    (harness.core.tolerances.REASONS['noise_factor'])."""
    if noise.numel() == 0:
        return noise
    return torch.clamp_min(noise_factor * torch.maximum(noise, noise.median()), floor)


def classify_tokens(x: torch.Tensor, golden: TargetFeatures, expected: int, envelope: Envelope,
                    *, noise_factor: float, separation: float, floor: float) -> TokenClasses:
    """x [T, H]: one slot of one prompt; golden: its fp32 training features; envelope: the
    same prompt computed by correct implementations in the engine's dtype, whose largest error
    at each token is the noise floor; floor: the least allowance (the fp32 bound). A token
    where some member itself is not identified as its boundary is one precision cannot decide:
    ambiguous unless the engine left zeros there. See harness.core.tolerances.REASONS
    ['noise_factor'] and ['separation'] for the bounds."""
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
    undecidable = torch.zeros(x.shape[0], dtype=torch.bool)
    r_max = torch.zeros(x.shape[0])
    for member in envelope.states(expected):
        r_own, r_alt, _ = distances(member)
        undecidable |= (r_own >= 1.0) | ((r_own > separation * r_alt) & (r_own > floor))
        r_max = torch.maximum(r_max, r_own)
    allowance = noise_allowance(r_max, noise_factor=noise_factor, floor=floor)
    tied = envelope.ties[expected]
    tiny = 1e-6 * golden.boundaries.norm(dim=-1).mean(0)  # [T]: "zero" at this token's scale
    is_zero = x.float().norm(dim=-1) <= tiny
    own_zero = own.norm(dim=-1) <= tiny
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
        elif d_own[t] <= allowance[t] and not clearly_other[t]:
            out.append(EXACT)
        elif tied[t]:
            out.append(ROUTING_TIE)
        elif clearly_other[t] or d_own[t] >= 1.0:
            out.append(WRONG)
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
    the envelope (a bug that moves every token a little, which identity alone misses)."""

    counts: dict[str, int]  # class -> tokens (over slots and prompts)
    wrong: list[tuple[int, int, int, str]]  # (prompt, slot, token, why)
    ambiguous: list[tuple[int, int, int]]  # (prompt, slot, token)
    drift: list[tuple[int, float, float]]  # (slot, median error, median allowance)
    worst: float
    tokens: int
    ties: list[tuple[int, int, int, float, float]] = dataclass_field(default_factory=list)
    members: list[str] = dataclass_field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.drift

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, **self.counts, "worst_rel_error": round(self.worst, 4),
                "ambiguous_at": [list(a) for a in self.ambiguous[:20]],
                # (prompt, slot, token, fp32 router margin, the members' score spread there)
                "routing_ties_at": [[p, s, t, round(m, 5), round(n, 5)]
                                    for p, s, t, m, n in self.ties[:20]],
                "envelope": self.members,
                "drifting_slots": [s for s, _, _ in self.drift]}


def classify_capture(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                     training_boundaries: Sequence[int], envelopes: Sequence[Envelope], *,
                     noise_factor: float, separation: float, floor: float) -> PrecisionFinding:
    """Classify every token of every slot (see `classify_tokens`); envelopes: per prompt, the
    features of the correct implementations in the engine's dtype. A slot drifts when most of
    its judged tokens (routing ties left out: a swapped expert is not drift), and at least
    DRIFT_MIN_TOKENS of them, are beyond their own allowance: every token a little off, each
    still clearly its own boundary (harness.core.tolerances.DRIFT_REASON)."""
    hidden = golden[0].boundaries.shape[-1]
    counts = dict.fromkeys(TOKEN_CLASSES, 0)
    wrong: list[tuple[int, int, int, str]] = []
    ambiguous: list[tuple[int, int, int]] = []
    ties: list[tuple[int, int, int, float, float]] = []
    per_slot_err: dict[int, list[torch.Tensor]] = {}
    per_slot_allowed: dict[int, list[torch.Tensor]] = {}
    worst, tokens = 0.0, 0
    for p, (x, g, env) in enumerate(zip(features, golden, envelopes, strict=True)):
        for s, b in enumerate(training_boundaries):
            chunk = x[:, s * hidden:(s + 1) * hidden].float()
            tc = classify_tokens(chunk, g, b, env, noise_factor=noise_factor,
                                 separation=separation, floor=floor)
            for cls in TOKEN_CLASSES:
                counts[cls] += tc.count(cls)
            for t in tc.tokens(WRONG):
                wrong.append((p, s, t, f"error {float(tc.errors[t]):.3g} to boundary {b}, "
                                       f"nearest other {tc.nearest_other[t]}"))
            ambiguous += [(p, s, t) for t in tc.tokens(AMBIGUOUS)]
            ties += [(p, s, t, float(env.margin[b, t]), float(env.spread[b, t]))
                     for t in tc.tokens(ROUTING_TIE)]
            judged = torch.tensor([c != ROUTING_TIE for c in tc.classes], dtype=torch.bool)
            per_slot_err.setdefault(s, []).append(tc.errors[judged])
            per_slot_allowed.setdefault(s, []).append(tc.allowance[judged])
            worst = max(worst, float(tc.errors[judged].max())) if bool(judged.any()) else worst
            tokens += chunk.shape[0]
    drift = []
    for s, errs in per_slot_err.items():
        judged_errs, allowed = torch.cat(errs), torch.cat(per_slot_allowed[s])
        if judged_errs.numel() < DRIFT_MIN_TOKENS:  # harness.core.tolerances.DRIFT_REASON
            continue
        beyond = int((judged_errs > allowed).sum())
        if 2 * beyond > judged_errs.numel():
            drift.append((s, float(judged_errs.median()), float(allowed.median())))
    return PrecisionFinding(counts=counts, wrong=wrong, ambiguous=ambiguous, drift=drift,
                            worst=worst, tokens=tokens, ties=ties,
                            members=list(envelopes[0].names) if envelopes else [])
