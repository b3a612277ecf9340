"""Evidence for the capture causes that no per-token slot label shows: a precision loss, a
normalisation applied, a partial residual sum, rows displaced in position, rows of another
request, slots interleaved, a batch-dependent capture — and, where nothing fits, what each
slot was seen to hold.

Each test fits one explicit model of the engine's slot to the golden states and accepts it
only where the fit is within the dtype's tolerance on every token it judges, so a cause is
named from evidence that fits it, never by elimination. Each finding carries its confidence
margin: how much worse the nearest competing explanation (the raw boundary, the next golden
state) fits than the one named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.tolerances import rtol_for
from harness.diagnosis.fingerprint import candidates, fingerprint, relative_errors
from harness.golden.features import TargetFeatures

# A state rounded through a 16-bit float (bf16: 8 significant bits, worst element error 2^-9)
# lands well inside this per-token bound; adjacent boundaries of the residual stream differ by
# far more (one layer's update), so an error this small with the trained boundary nearest is
# a precision loss, not a wiring bug.
PRECISION_BOUND = 2.0 ** -5
SHIFTS = (1, -1, 2, -2, 3, -3)
# A fitted cause's margin is its runner-up's error over its own, its own floored here: the fp32
# tolerance (summation order), below which no fit is better than another. Not the dtype's label
# tolerance: in bf16 that (0.05) is as large as a missing MLP update, and every margin would be ~1.
FIT_FLOOR = rtol_for("float32")
_RAW_EXPERIMENT = ("serve the same prompts in fp32, where rounding cannot blur the fitted state "
                   "and the raw boundary")


@dataclass
class Finding:
    """One explanation that fits: its kind, a sentence of what was seen, the confidence margin
    (how many times worse the nearest competing explanation fits) and the numbers."""

    kind: str
    seen: str
    margin: float
    data: dict[str, Any] = field(default_factory=dict)
    # the competing explanation nearest in fit, where one was scored (issue #31), and the
    # experiment that would separate the two
    runner_up: str | None = None
    experiment: str | None = None


def _chunk(x: torch.Tensor, s: int, hidden: int) -> torch.Tensor:
    return x.float()[:, s * hidden:(s + 1) * hidden]


def _live(gold: TargetFeatures, b: int) -> torch.Tensor:
    """Tokens where boundary b is not ~zero (a pad token's embedding is zero)."""
    ref = gold.boundaries[b].float().norm(dim=-1)
    return ref > 1e-6 * gold.boundaries.float().norm(dim=-1).mean(0)


def _off_slots(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
               train: Sequence[int], rtol: float) -> list[int]:
    hidden = golden[0].boundaries.shape[-1]
    off = []
    for s, b in enumerate(train):
        if any(bool((relative_errors(_chunk(x, s, hidden), g.boundaries[b]) > rtol).any())
               for x, g in zip(features, golden, strict=True)):
            off.append(s)
    return off


def _judged_off_slots(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                      train: Sequence[int], rtol: float, separation: float = 0.0) -> list[int]:
    """The slots off training, where the width lets slots be judged one by one ([] if not).
    Reduced precision (separation > 0): a slot whose median token is within rtol is its
    trained boundary with a few tokens precision carried past the bound, not a slot to fit."""
    if not _width_ok(features, golden, train):
        return []
    off = _off_slots(features, golden, train, rtol)
    if separation <= 0:
        return off
    hidden = golden[0].boundaries.shape[-1]
    return [s for s in off if float(torch.cat([
        relative_errors(_chunk(x, s, hidden), g.boundaries[train[s]])
        for x, g in zip(features, golden, strict=True)]).median()) > rtol]


def _width_ok(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
              train: Sequence[int]) -> bool:
    hidden = golden[0].boundaries.shape[-1]
    return all(int(x.shape[-1]) == len(train) * hidden for x in features)


def _fits(fit: torch.Tensor, raw: torch.Tensor, rtol: float, separation: float) -> bool:
    """Whether a model of the slot fits its tokens: fit [T] the per-token error to the model's
    state, raw [T] to the trained boundary itself. fp32 (separation 0): every token within rtol.
    Reduced precision: the median token within rtol of the model, and no token beyond rtol
    identified as the raw boundary instead (`separation` times nearer it than the model).
    Precision noise carries a few tokens past any fixed bound (a bf16 routing flip moves a
    token's state by ~0.2 from that layer on; harness.core.tolerances.REASONS['rtol']): such a
    token, near neither, is evidence of nothing, never the typical token."""
    if not fit.numel():
        return False
    if separation <= 0:
        return float(fit.max()) <= rtol
    contradicts = (fit > rtol) & (fit >= separation * raw)
    return not bool(contradicts.any()) and float(fit.median()) <= rtol


def precision(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
              train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """Every slot, on every live token, nearest to its trained boundary among all golden
    states, off by a small error of uniform size: the state went through a lower precision.
    fp32 (separation 0): the error must exceed rtol. Reduced precision (separation > 0): rtol
    (0.02 in fp16) is above bf16 rounding, so the error cannot be told by it; this fit is only
    asked where the dtype's precision envelope already judged the slots off while every token
    stayed nearest its own boundary (`diagnose_capture`'s judged_off), which is the evidence of
    a coarser rounding than the dtype's (an fp16 engine's aux states through a bf16 buffer)."""
    if not _width_ok(features, golden, train):
        return None
    hidden = golden[0].boundaries.shape[-1]
    errs: list[torch.Tensor] = []
    ratios: list[torch.Tensor] = []
    scaled: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for x, g in zip(features, golden, strict=True):
        _, states = candidates(g)
        for s, b in enumerate(train):
            chunk = _chunk(x, s, hidden)
            err = relative_errors(chunk[None], states)  # [C, T]
            live = _live(g, b)
            own = err[b][live]
            others = torch.cat([err[:b], err[b + 1:]])[:, live].min(dim=0).values
            if bool((own >= others).any()):
                return None  # some token is nearer another state: not a uniform precision loss
            errs.append(own)
            ratios.append(others / own.clamp_min(1e-12))
            ref = states[b][live]
            c = (chunk[live] * ref).sum(-1, keepdim=True) / ref.pow(2).sum(-1, keepdim=True).clamp_min(1e-30)
            scaled.setdefault(s, []).append((own, relative_errors(chunk[live], c * ref)))
    e = torch.cat(errs)
    if not e.numel():
        return None
    # rounding noise is spread over all H channels, almost orthogonal to the state: one scalar
    # per token removes ~1/H of it. A rescale (a wrong norm eps, a scale factor) is parallel to
    # the state and that scalar removes it all: a slot where it does is no precision loss
    # (issue #31, a cause the evidence does not carry)
    for pairs in scaled.values():
        own_s, fit_s = (torch.cat(t) for t in zip(*pairs, strict=True))
        if own_s.numel() and float(fit_s.median()) < float(own_s.median()) / 4:
            return None
    # reduced precision: the dtype's own noise carries a few tokens past any fixed bound (a
    # routing flip; harness.core.tolerances.REASONS['rtol']), so the bound holds the typical
    # token (90%), not the worst (an fp16 run's pinned prompts: one token at 0.053)
    top = float(e.max()) if separation <= 0 else float(e.quantile(0.9))
    if top > PRECISION_BOUND or (separation <= 0 and top <= rtol):
        return None
    lo, hi = float(e.quantile(0.1)), float(e.quantile(0.9))
    if lo < hi / 20:
        return None  # not uniform: a few tokens wrong is another cause
    med = float(e.median())
    size = ("the size of fp16 rounding" if med <= 4e-4 else "the size of bf16 rounding"
            if med <= 4e-3 else "larger than bf16 rounding (noise or an 8-bit format)")
    margin = float(torch.cat(ratios).min())
    return Finding("precision_loss",
                   f"every slot is nearest to its trained boundary on every token, with a uniform "
                   f"relative error (median {med:.2g}, 10-90% {lo:.2g}..{hi:.2g}, {size}) beyond "
                   + (f"the fp32 tolerance {rtol:g}" if separation <= 0 else
                      "the spread of correct implementations in the engine's dtype (its precision "
                      "envelope)") + f"; the next golden state is at least {margin:.3g}x "
                   f"farther", margin, {"median_rel_error": med, "p10": lo, "p90": hi})


def _gain_fit(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token relative error of the best fit x_t = c_t * (g ⊙ ref_t): a per-token rescale
    (any RMSNorm/LayerNorm-without-centring, whatever its eps) times one per-channel gain
    (its weight), by alternating least squares."""
    c = 1.0 / ref.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)
    g = torch.ones(ref.shape[-1])
    for _ in range(4):
        u = c * ref
        g = (x * u).sum(0) / u.pow(2).sum(0).clamp_min(1e-12)
        v = g * ref
        c = (x * v).sum(-1, keepdim=True) / v.pow(2).sum(-1, keepdim=True).clamp_min(1e-12)
    return relative_errors(x, c * g * ref)


def normalised(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
               train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """Every off slot is its trained boundary rescaled per token and weighted per channel:
    the engine captured it after a normalisation (a layer's input norm)."""
    off = _judged_off_slots(features, golden, train, rtol, separation)
    if not off:
        return None
    hidden = golden[0].boundaries.shape[-1]
    worst_fit, raw_med, worst_scalar = 0.0, math.inf, 0.0
    for s in off:
        b = train[s]
        xs = torch.cat([_chunk(x, s, hidden)[_live(g, b)] for x, g in zip(features, golden, strict=True)])
        refs = torch.cat([g.boundaries[b].float()[_live(g, b)] for g in golden])
        if xs.shape[0] < 2 or bool((xs.norm(dim=-1) <= 1e-6 * refs.norm(dim=-1)).any()):
            return None  # zero rows are a skipped capture, not a rescaled one
        fit = _gain_fit(xs, refs)
        raw = relative_errors(xs, refs)
        if not _fits(fit, raw, rtol, separation):
            return None
        worst_fit = max(worst_fit, float(fit.max()))
        raw_med = min(raw_med, float(raw.median()))
        # the simpler rival: one constant factor for the whole slot (an embedding multiplier,
        # a scaled buffer), which a norm's per-token rescale contains as a special case
        scale = float((xs * refs).sum() / refs.pow(2).sum().clamp_min(1e-12))
        worst_scalar = max(worst_scalar, float(relative_errors(xs, scale * refs).max()))
    if raw_med <= rtol:
        return None
    own = max(worst_fit, FIT_FLOOR)
    rivals = {"the raw trained boundaries": raw_med,
              "one constant scale factor (not a norm: no per-token rescale)": max(worst_scalar, FIT_FLOOR)}
    runner_up = min(rivals, key=lambda k: rivals[k])
    margin = rivals[runner_up] / own
    return Finding("normalised",
                   f"slots {off} equal their trained boundaries after a per-token rescale and one "
                   f"per-channel gain (worst fit error {worst_fit:.2g}, tolerance {rtol:g}; the raw "
                   f"boundaries are off by a median {raw_med:.2g}; one constant scale fits to "
                   f"{worst_scalar:.2g})",
                   margin, {"slots": off, "fit_error": worst_fit, "raw_error": raw_med,
                            "scalar_fit_error": worst_scalar}, runner_up=runner_up,
                   experiment="compare the slot's per-token norms with the trained boundary's: a "
                              "norm makes them equal across tokens (up to its weight), a constant "
                              "factor keeps their ratio fixed; and check the engine's embedding "
                              "or buffer scale")


def partial_residual(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                     train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """Every off slot is its trained boundary k minus layer k-1's MLP output: the residual
    stream after attention only, a partial sum (an engine capturing `residual` alone)."""
    off = _judged_off_slots(features, golden, train, rtol, separation)
    if not off or any(train[s] == 0 for s in off):
        return None
    hidden = golden[0].boundaries.shape[-1]
    worst, raw = 0.0, math.inf
    for s in off:
        b = train[s]
        fits, raws = [], []
        for x, g in zip(features, golden, strict=True):
            part = g.boundaries[b].float() - g.mlp_out[b].float()
            chunk = _chunk(x, s, hidden)
            fits.append(relative_errors(chunk, part))
            raws.append(relative_errors(chunk, g.boundaries[b]))
            raw = min(raw, float(raws[-1].median()))
        fit = torch.cat(fits)
        if not _fits(fit, torch.cat(raws), rtol, separation):
            return None
        worst = max(worst, float(fit.max()))
    margin = raw / max(worst, FIT_FLOOR)  # below it every fit is as good (issue #31)
    return Finding("partial_residual",
                   f"slots {off} equal boundary k minus layer k-1's MLP output, the residual "
                   f"stream after attention only, on every token (worst error {worst:.2g}; the "
                   f"full boundaries are {margin:.3g}x farther)", margin,
                   {"slots": off, "fit_error": worst, "raw_error": raw},
                   runner_up="the raw trained boundaries", experiment=_RAW_EXPERIMENT)


def position_shift(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                   train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """Every off slot holds, at token t, its trained boundary at token t - d for one d != 0:
    rows displaced in position (a feature paired with the wrong token)."""
    off = _judged_off_slots(features, golden, train, rtol, separation)
    if not off:
        return None
    hidden = golden[0].boundaries.shape[-1]
    for d in SHIFTS:
        judged, worst, raw = 0, 0.0, math.inf
        fits: list[torch.Tensor] = []
        unshifted: list[torch.Tensor] = []
        for s in off:
            b = train[s]
            for x, g in zip(features, golden, strict=True):
                t = x.shape[0]
                if t <= abs(d):
                    continue
                ref = g.boundaries[b].float()
                got = _chunk(x, s, hidden)
                cur, want = (got[d:], ref[:t - d]) if d > 0 else (got[:t + d], ref[-d:])
                live = (want.norm(dim=-1) > 0)
                if not live.any():
                    continue
                fits.append(relative_errors(cur[live], want[live]))
                # the same rows against their own position's state: the unshifted reading
                own = ref[d:] if d > 0 else ref[:t + d]
                unshifted.append(relative_errors(cur[live], own[live]))
                worst = max(worst, float(fits[-1].max()))
                raw = min(raw, float(relative_errors(got, ref).median()))
                judged += int(live.sum())
        if judged and _fits(torch.cat(fits), torch.cat(unshifted), rtol, separation):
            margin = raw / max(worst, FIT_FLOOR)  # below it every fit is as good (issue #31)
            return Finding("position_shifted",
                           f"slots {off} hold at token t training's state of token t{-d:+d} on "
                           f"all {judged} tokens judged (worst error {worst:.2g}); the same "
                           f"token's state is {margin:.3g}x farther", margin,
                           {"slots": off, "shift": d, "tokens": judged},
                           runner_up="the raw trained boundaries", experiment=_RAW_EXPERIMENT)
    return None


def request_mixed(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                  train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """The off rows of one prompt are another prompt's trained states at the same positions,
    in every slot and from one source prompt: the engine handed a request another request's
    features (batch rows misindexed). A stale slot beside fresh ones is a skipped capture.
    Rows are matched within rtol in every dtype (another request's state is far beyond it, a
    copied row is within precision of its source), so `separation` is not used."""
    if len(features) < 2 or not _width_ok(features, golden, train):
        return None
    hidden = golden[0].boundaries.shape[-1]
    off_rows = matched = 0
    pairs: dict[int, int] = {}
    for p, x in enumerate(features):
        offs = [bool((relative_errors(_chunk(x, s, hidden), golden[p].boundaries[b]) > rtol).any())
                for s, b in enumerate(train)]
        if any(offs) and not all(offs):
            return None  # some slots fresh, some not: stale slots, not a whole request swapped
        for s, b in enumerate(train):
            chunk = _chunk(x, s, hidden)
            own = relative_errors(chunk, golden[p].boundaries[b]) > rtol
            if not own.any():
                continue
            best_q, best_hits, best_n = None, -1, 0
            for q, g in enumerate(golden):
                n = min(chunk.shape[0], g.boundaries.shape[1])
                if q == p or n == 0:
                    continue
                ok = relative_errors(chunk[:n], g.boundaries[b, :n]) <= rtol
                hits = int((ok & own[:n]).sum())
                if hits > best_hits:
                    best_q, best_hits, best_n = q, hits, n
            if best_q is None:
                return None
            # rows past the source's length hold its padding: not comparable with any golden row
            comparable = int(own[:best_n].sum())
            if best_hits and pairs.setdefault(p, best_q) != best_q:
                return None  # one request's slots from different requests: not one swap
            off_rows += comparable
            matched += best_hits
    if not off_rows or matched < 0.9 * off_rows:  # one exact row of another request is evidence
        return None
    return Finding("request_mixed",
                   f"{matched}/{off_rows} off rows (those within the source prompt's length) equal "
                   f"another prompt's trained state at the same position (prompt -> source: "
                   f"{dict(list(pairs.items())[:6])})",
                   off_rows / max(off_rows - matched, 1),
                   {"matched_rows": matched, "off_rows": off_rows, "sources": pairs})


def interleaved(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                train: Sequence[int], rtol: float, separation: float = 0.0) -> Finding | None:
    """Read as [T, H, n] (slot index fastest) instead of [T, n, H], the features are exactly
    the trained slots: the engine stacked its slots and flattened them, not concatenated."""
    n = len(train)
    if n < 2 or not _width_ok(features, golden, train):
        return None
    hidden = golden[0].boundaries.shape[-1]
    fixed = [x.float().reshape(x.shape[0], hidden, n).transpose(1, 2).reshape(x.shape[0], n * hidden)
             for x in features]
    if not all(s.exact for s in fingerprint(fixed, golden, train, rtol, separation)):
        return None
    # the runner-up is the concatenation as handed over: its error over the tolerance the
    # re-read layout is exact within (issue #31: a margin, not an infinite fit)
    raw = float(torch.cat([relative_errors(_chunk(x, s, hidden), g.boundaries[b])
                           for x, g in zip(features, golden, strict=True)
                           for s, b in enumerate(train)]).median())
    return Finding("slots_interleaved",
                   f"read with the slot index fastest ([T, H, {n}] instead of [T, {n}, H]) the "
                   f"features equal all {n} trained slots on every token (as concatenated they "
                   f"are off by a median {raw:.2g})", raw / FIT_FLOOR,
                   {"layout": f"[T, H, {n}]", "raw_error": raw}, runner_up="the slots as concatenated")


def _matches_training(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                      train: Sequence[int], rtol: float, separation: float) -> bool:
    """fp32: every token within rtol. Reduced precision: every slot identified as its trained
    boundary on every token precision can decide (harness.diagnosis.fingerprint), and no slot
    off it on the median token (`_judged_off_slots`): a state that no golden boundary is (a
    layer's input-normed state) leaves most tokens undecidable, not wrong, so identity alone
    would call it trained."""
    if separation <= 0:
        return not _off_slots(features, golden, train, rtol)
    return _width_ok(features, golden, train) and all(
        s.exact for s in fingerprint(features, golden, train, rtol, separation)) and not (
        _judged_off_slots(features, golden, train, rtol, separation))


def batch_dependence(features: Sequence[torch.Tensor], alone: Sequence[torch.Tensor],
                     golden: Sequence[TargetFeatures], train: Sequence[int],
                     rtol: float, separation: float = 0.0) -> Finding | None:
    """Each prompt captured alone matches training, in the batch it does not: the capture
    depends on the batch (rows of another request where they match one exactly)."""
    if not _off_slots(features, golden, train, rtol) or not _matches_training(
            alone, golden, train, rtol, separation):
        return None
    mixed = request_mixed(features, golden, train, rtol)
    bad = [p for p, (x, a) in enumerate(zip(features, alone, strict=True))
           if x.shape != a.shape or bool((relative_errors(x, a) > rtol).any())]
    if mixed is None and not bad:
        return None  # the batch changes nothing the tolerance sees: not the cause (issue #31)
    if mixed is not None:
        mixed.seen += f"; captured alone every prompt matches training (prompts off in the batch: {bad[:8]})"
        return mixed
    worst = max(float(relative_errors(x, a).max()) for x, a in zip(features, alone, strict=True)
                if x.shape == a.shape)
    return Finding("batch_dependent",
                   f"every prompt captured alone matches training on every slot and token; in one "
                   f"batch of {len(features)}, prompts {bad[:8]} differ from their own solo capture "
                   f"(worst relative error {worst:.3g}, tolerance {rtol:g}) and match no other "
                   f"prompt's state", worst / rtol, {"prompts_off": bad})


FITS = (interleaved, precision, normalised, partial_residual, position_shift, request_mixed)


def explain(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
            train: Sequence[int], rtol: float,
            alone: Sequence[torch.Tensor] | None = None, separation: float = 0.0) -> Finding | None:
    """The first model of the engine's slots that fits the evidence (batch dependence first
    where solo captures are given: it is the one the others cannot see); separation > 0 in
    reduced precision (see `_fits`)."""
    if alone is not None:
        found = batch_dependence(features, alone, golden, train, rtol, separation)
        if found is not None:
            return found
    for fit in FITS:
        found = fit(features, golden, train, rtol, separation)
        if found is not None:
            return found
    return None


def seen_per_slot(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                  train: Sequence[int], rtol: float) -> list[dict[str, Any]]:
    """For an unrecognised capture: per slot, the two golden states nearest (median per-token
    relative error) and the first tokens (prompt, position) beyond tolerance."""
    hidden = golden[0].boundaries.shape[-1]
    width = int(features[0].shape[-1])
    out = []
    for s in range(width // hidden):
        labels: list[Any] = []
        errs: list[torch.Tensor] = []
        off_tokens: list[tuple[int, int]] = []
        for p, (x, g) in enumerate(zip(features, golden, strict=True)):
            names, states = candidates(g)
            labels = names
            err = relative_errors(_chunk(x, s, hidden)[None], states)  # [C, T]
            errs.append(err)
            if s < len(train):
                bad = (err[train[s]] > rtol).nonzero().flatten().tolist()
                off_tokens.extend((p, int(t)) for t in bad[:max(0, 5 - len(off_tokens))])
        med = torch.cat(errs, dim=1).median(dim=1).values
        order = med.argsort()[:2].tolist()
        out.append({"slot": s, "expected": train[s] if s < len(train) else None,
                    "nearest": [{"state": str(labels[i]), "median_rel_error": float(med[i])}
                                for i in order],
                    "first_off_tokens": off_tokens})
    return out


def label_fit(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
              found: Sequence[Any], rtol: float) -> tuple[float, float]:
    """For a cause read off slot labels: (margin, farthest). margin: over the slots whose label
    is a golden state, the smallest (median over tokens) ratio of the next-nearest state's
    error to the labelled state's, how clearly each slot is what it is said to hold.
    farthest: the largest median error of a labelled slot to its labelled state, which says
    whether the label is the slot's state or merely the golden state nearest it: in reduced
    precision a slot holding a state no golden boundary is (one rescaled by a layer's input
    norm, a residual without its MLP update) is still labelled by its nearest candidate, which
    can be the embedding or the final norm's output, median errors of 0.3-0.8 away."""
    hidden = golden[0].boundaries.shape[-1]
    worst, farthest = math.inf, 0.0
    for s, label in enumerate(found):
        ratios, own = [], []
        for x, g in zip(features, golden, strict=True):
            names, states = candidates(g)
            if label not in names:
                break
            i = names.index(label)
            err = relative_errors(_chunk(x, s, hidden)[None], states)
            others = torch.cat([err[:i], err[i + 1:]]).min(dim=0).values
            ratios.append(others / err[i].clamp_min(rtol * 1e-3))
            own.append(err[i])
        if ratios:
            worst = min(worst, float(torch.cat(ratios).median()))
            farthest = max(farthest, float(torch.cat(own).median()))
    return worst, farthest
