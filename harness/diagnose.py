"""Root-cause diagnosis: turn "the engine's aux features differ from training" into one named
cause and the id list (or engine fix) that removes it.

Each engine slot is fingerprinted token by token against every golden boundary and the states
engines hand over by mistake (boundary N after the final norm, an MLP output without its
residual, zeros). Token-level matching, not a whole-tensor distance, is what makes this
robust: an engine that skips capture on some layers or positions leaves a slot that is right
on some tokens and stale elsewhere, and a whole-tensor distance would call it "no match".
Distances are relative per token, so a bf16 engine matches at a bf16 tolerance.

The fc-level and vocab-level kinds are built by small constructors: the checks that observe
those bugs decide when, this module only words them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness.boundaries import (
    CONVENTIONS,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
    short_boundary,
)
from harness.golden.features import TargetFeatures

CRASH_KINDS = ("engine_crash", "hang")
VALUE_KINDS = ("non_finite",)  # harness.finite
CAPTURE_KINDS = ("ok", "offset", "embedding_missing", "order_permuted", "final_boundary_normed",
                 "final_boundary_missing", "residual_missing", "stale_or_skipped", "ids_ignored",
                 "unknown")
FC_KINDS = ("fc_skipped", "fc_wrong", "fc_on_recurrent_state", "d2t_absolute",
            "draft_kv_not_rolled_back")
KINDS = CAPTURE_KINDS + FC_KINDS + CRASH_KINDS + VALUE_KINDS

# Relative per-token L2 error at which a state counts as "the same": loose enough for an
# engine computing the whole target in that dtype, far below the distance between adjacent
# boundaries (> 0.3 relative on the tiny target).
RTOL = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}

FINAL_NORMED = "final_normed"
ZERO = "zero"


# Share of tokens per slot allowed beyond rtol in reduced precision: bf16 rounding flips MoE
# routing near ties at a few tokens (seen on an H200: 4-5 of 265 tokens, relative error up to
# 0.4), while a real wiring bug moves whole slots or whole positions. fp32 allows none.
OUTLIER_BUDGET = {"float32": 0.0, "float16": 0.03, "bfloat16": 0.03}


# fp32 router margin (score units, see harness.models.target.routing_margins) below which a
# token's routing counts as a near-tie for the dtype: bf16 hidden states carry ~1% relative
# error by the middle layers, which moves sigmoid router scores by up to ~5e-3; the bound is
# twice that. fp16 has 3 more mantissa bits. fp32 excuses nothing. Seen on an H200: prompt
# [18] routes with margin 1.7e-3 at layer 1, and bf16 flipped it (relative error 0.12).
ROUTING_NOISE = {"float32": 0.0, "float16": 1.25e-3, "bfloat16": 1e-2}


def routing_noise_for(dtype: str | torch.dtype) -> float:
    return ROUTING_NOISE.get(str(dtype).removeprefix("torch."), 0.0)


def outlier_budget_for(dtype: str | torch.dtype) -> float:
    return OUTLIER_BUDGET.get(str(dtype).removeprefix("torch."), 0.0)


def rtol_for(dtype: str | torch.dtype) -> float:
    name = str(dtype).removeprefix("torch.")
    try:
        return RTOL[name]
    except KeyError:
        raise ValueError(f"no tolerance for dtype {name!r}; use one of {sorted(RTOL)}") from None


def mlp_label(k: int) -> str:
    """Label of boundary k without its residual: layer k-1's MLP/MoE output alone."""
    return f"mlp_out[{k}]"


Label = int | str | None


@dataclass
class SlotMatch:
    """What one engine slot holds. `found` is the label most of its tokens match: a boundary
    int, "final_normed", "mlp_out[k]", "zero", or None (most tokens match nothing)."""

    slot: int
    expected: int | None  # the training boundary for this slot (None: an extra engine slot)
    found: Label
    match_fraction: float  # share of tokens whose nearest candidate (within tol) is `found`
    expected_fraction: float  # share of tokens within tol of the expected boundary
    zero_fraction: float
    rel_error: float  # whole-slot relative L2 error against the expected boundary
    cosine: float  # whole-slot cosine against the expected boundary
    telling_hits: int = 0  # tokens matching the expected boundary where it is not ~zero
    token_labels: Counter[Label] = field(default_factory=Counter, repr=False)
    tolerated: bool = False  # within the dtype's outlier budget (see OUTLIER_BUDGET)

    @property
    def exact(self) -> bool:
        return self.expected is not None and (self.expected_fraction == 1.0 or self.tolerated)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["token_labels"] = {str(k): v for k, v in self.token_labels.items()}
        for key in ("rel_error", "cosine"):
            if math.isnan(out[key]):
                out[key] = None
        return out


@dataclass
class Diagnosis:
    kind: str
    message: str
    engine_boundaries: list[Label]
    training_boundaries: list[int]
    suggested_layer_ids: list[int] | None
    slots: list[SlotMatch] = field(default_factory=list)
    engine_convention: str | None = None
    consistent_conventions: list[str] = field(default_factory=list)
    num_layers: int | None = None
    offset: int | None = None  # the signed shift, for kind "offset"
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown diagnosis kind {self.kind!r}; use one of {KINDS}")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "engine_boundaries": list(self.engine_boundaries),
            "training_boundaries": list(self.training_boundaries),
            "suggested_layer_ids": self.suggested_layer_ids,
            "engine_convention": self.engine_convention,
            "consistent_conventions": list(self.consistent_conventions),
            "num_layers": self.num_layers,
            "offset": self.offset,
            "slots": [s.to_json() for s in self.slots],
            "details": dict(self.details),
        }


# -- fingerprinting ---------------------------------------------------------------------------


def relative_errors(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per token (last dim reduced), |x - ref| / |ref| in fp32: the one error measure every
    capture and fc comparison uses. Broadcasts, so x [T, H] against ref [C, T, H] gives [C, T]."""
    ref = ref.float()
    err = (x.float() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    # NaN > rtol is False: a NaN error must count as the worst error, never as a match
    return torch.nan_to_num(err, nan=math.inf, posinf=math.inf)


def _candidates(golden: TargetFeatures) -> tuple[list[Label], torch.Tensor]:
    """Every state an engine could plausibly hand the draft, stacked [C, T, H]."""
    n = golden.num_layers
    labels: list[Label] = list(range(n + 1)) + [FINAL_NORMED] + [mlp_label(k) for k in range(1, n + 1)]
    states = torch.cat([golden.boundaries.float(), golden.final_normed.float()[None],
                        golden.mlp_out[1:].float()], dim=0)
    return labels, states


def nearest_labels(chunk: torch.Tensor, golden: TargetFeatures) -> list[Label]:
    """Per token, the golden state ([T, H] chunk of one slot) lies closest to, by relative
    error: what the engine's state is still recognisable as when it is beyond tolerance."""
    labels, states = _candidates(golden)
    return [labels[int(i)] for i in relative_errors(chunk[None], states).argmin(dim=0)]


def _match_slot(slot: int, chunks: list[torch.Tensor], golden: Sequence[TargetFeatures],
                expected: int | None, rtol: float) -> SlotMatch:
    counts: Counter[Label] = Counter()
    in_tol = telling = zeros = total = 0
    diff_sq = ref_sq = dot = x_sq = 0.0
    for x, gold in zip(chunks, golden, strict=True):
        labels, states = _candidates(gold)
        err = relative_errors(x[None], states)  # [C, T]
        x_norm = x.norm(dim=-1)
        tiny = 1e-6 * gold.boundaries.norm(dim=-1).mean(0)  # [T]: "zero" at this token's scale
        is_zero = x_norm <= tiny
        best_err, best = err.min(dim=0)
        for t in range(x.shape[0]):
            if best_err[t] <= rtol:  # before the zero test: a pad token's embedding is zero
                counts[labels[int(best[t])]] += 1
            elif is_zero[t]:
                counts[ZERO] += 1
            else:
                counts[None] += 1
        zeros += int(is_zero.sum())
        total += x.shape[0]
        if expected is not None:
            ref = gold.boundaries[expected].float()
            hit = err[expected] <= rtol
            in_tol += int(hit.sum())
            telling += int((hit & (ref.norm(dim=-1) > tiny)).sum())
            diff_sq += float(((x - ref) ** 2).sum())
            ref_sq += float((ref ** 2).sum())
            dot += float((x * ref).sum())
            x_sq += float((x ** 2).sum())
    found, hits = counts.most_common(1)[0]
    nan = float("nan")
    rel = math.sqrt(diff_sq / ref_sq) if expected is not None and ref_sq > 0 else nan
    cos = dot / math.sqrt(x_sq * ref_sq) if expected is not None and x_sq * ref_sq > 0 else nan
    return SlotMatch(slot=slot, expected=expected, found=found, match_fraction=hits / total,
                     expected_fraction=in_tol / total if expected is not None else 0.0,
                     zero_fraction=zeros / total, rel_error=rel, cosine=cos,
                     telling_hits=telling, token_labels=counts)


def fingerprint(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                training_boundaries: Sequence[int], rtol: float) -> list[SlotMatch]:
    """Match every engine slot (H-wide chunk of the features) against the golden states."""
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
        slots.append(_match_slot(s, chunks, golden, expected, rtol))
    return slots


# -- classification ---------------------------------------------------------------------------


def _phrase(label: Label, n: int) -> str:
    if isinstance(label, int):
        return f"boundary {label} ({short_boundary(label, n)})"
    if label == FINAL_NORMED:
        return f"boundary {n} after the final norm"
    if label == ZERO:
        return "all zeros"
    if isinstance(label, str) and label.startswith("mlp_out["):
        k = int(label[len("mlp_out["):-1])
        return f"layer {k - 1}'s MLP output without the residual (boundary {k} minus its residual)"
    return "no boundary of the target"


def _slot_is_stale(s: SlotMatch) -> bool:
    """Right on some tokens, zero or unmatched on the rest: capture skipped for some positions
    or layers, leaving stale or zero values behind."""
    if s.expected is None or s.exact:
        return False
    if 0 < s.expected_fraction < 1 and s.telling_hits:
        rest = sum(v for k, v in s.token_labels.items() if k in (ZERO, None))
        wrong = sum(v for k, v in s.token_labels.items() if k not in (ZERO, None, s.expected))
        return rest > 0 and rest >= wrong
    return False


def _classify(slots: list[SlotMatch], train: list[int], n: int) -> tuple[str, int | None, int | None]:
    """(kind, offset, the slot the message should point at)."""
    found = [s.found for s in slots]
    if len(slots) == len(train) and all(s.exact for s in slots):
        return "ok", None, None
    for s in slots:
        # A post-norm state in any slot: the engine took its deepest capture after the final
        # norm (wherever training put that slot, no pre-norm boundary equals it).
        if s.found == FINAL_NORMED and s.expected is not None:
            return "final_boundary_normed", None, s.slot
    for s in slots:
        if s.expected is not None and s.found == mlp_label(s.expected) and s.expected > 0:
            return "residual_missing", None, s.slot
    for s in slots:
        if _slot_is_stale(s):
            return "stale_or_skipped", None, s.slot
    for s in slots:
        if s.found == ZERO and s.expected is not None and s.expected not in (0, n):
            return "stale_or_skipped", None, s.slot
    first_bad = next((s.slot for s in slots if not s.exact), min(len(slots), len(train) - 1))
    ints = [f for f in found if isinstance(f, int)]
    if len(slots) == len(train) and len(ints) == len(found):
        if sorted(ints) == sorted(train):
            return "order_permuted", None, first_bad
        shifts = {f - t for f, t in zip(ints, train, strict=True)}
        if len(shifts) == 1:
            return "offset", shifts.pop(), first_bad
        # a shift that cannot move an endpoint: "-1 = embedding" honoured while every real id
        # shifts, or a +1 that stops at the last layer's output (no boundary beyond N)
        inner = {f - t for f, t in zip(ints, train, strict=True) if not (f == t and t in (0, n))}
        if len(inner) == 1 and 0 not in inner:
            return "offset", inner.pop(), first_bad
    if 0 in train and 0 not in found:
        return "embedding_missing", None, train.index(0) if train.index(0) < len(slots) else first_bad
    if n in train and n not in found:
        return "final_boundary_missing", None, train.index(n) if train.index(n) < len(slots) else first_bad
    if len(ints) == len(found) < len(train) and set(ints) < set(train):
        # every slot that arrived is right, some never did: capture skipped for those layers
        # (SGLang's two-batch-overlap path captures nothing past the dense layers)
        return "stale_or_skipped", None, None
    return "unknown", None, first_bad


_CAUSE = {
    "embedding_missing": "embedding missing — the engine shifted ids or cannot capture the embedding",
    "final_boundary_missing": "final boundary missing — the engine never captures the last layer's output",
    "final_boundary_normed": "final boundary normed — the engine hands over the last layer's output after the final norm",
    "residual_missing": "residual missing — the engine captures the MLP output without adding the residual back",
    "order_permuted": "order permuted — the right boundaries in the wrong slots",
    "stale_or_skipped": "capture skipped — the engine skips capture for some layers or positions and leaves stale or zero values",
    "ids_ignored": "ids ignored — the engine captured its own default boundaries, not the ids the draft "
                   "config lists (vLLM's V2 model runner reads a top-level eagle_aux_hidden_state_layer_ids "
                   "or eagle_config.layer_ids, never the nested eagle_config.eagle_aux_hidden_state_layer_ids "
                   "that SpecForge writes, and falls back to the model's (2, N//2, N-3))",
    "unknown": "unknown — no single known cause explains the slots",
}
_ENGINE_BUGS = ("final_boundary_normed", "residual_missing", "stale_or_skipped")


def _ignored_ids(found: list[Label], train: list[int], n: int, engine_convention: str | None,
                 config_ids: Sequence[int] | None) -> bool:
    """The slots hold the engine's default boundaries while the config asked for others: the
    engine never read the ids (checked before the per-slot causes, which would otherwise
    blame whichever slot happens to differ)."""
    if not config_ids or found == train or not all(isinstance(f, int) for f in found):
        return False
    names = [engine_convention] if engine_convention else list(CONVENTIONS)
    defaults = {tuple(get_convention(c).default_boundaries(n)) for c in names}
    if tuple(found) not in defaults:
        return False
    for c in names:
        try:
            if list(ids_to_boundaries(config_ids, c, n)) == found:
                return False  # the ids, read in some convention, say exactly these boundaries
        except LayerIdError:
            continue
    return True


def _consistent(config_ids: Sequence[int] | None, found: list[Label], n: int) -> list[str]:
    if not config_ids or not all(isinstance(f, int) for f in found):
        return []
    out = []
    for name, conv in CONVENTIONS.items():
        try:
            if list(ids_to_boundaries(config_ids, conv, n)) == found:
                out.append(name)
        except LayerIdError:
            continue
    return out


def diagnose_capture(
    features: Sequence[torch.Tensor],
    golden: Sequence[TargetFeatures],
    training_boundaries: Sequence[int],
    *,
    engine_convention: str | None = None,
    config_ids: Sequence[int] | None = None,
    rtol: float = RTOL["float32"],
    outlier_budget: float = 0.0,
) -> Diagnosis:
    """Name the root cause of an aux-feature mismatch.

    features: per prompt, what the engine handed the draft, [T, n*H] in engine slot order;
    golden: the fp32 training-time features of the same prompts; training_boundaries: the
    boundaries training put in each slot; engine_convention: a key of CONVENTIONS, to word
    the fix as an id list; config_ids: the draft config's ids, to say which convention the
    engine behaved like; rtol: per-token relative tolerance (see `rtol_for`).
    """
    n = golden[0].num_layers
    train = [int(b) for b in training_boundaries]
    slots = fingerprint(features, golden, train, rtol)
    for s in slots:
        s.tolerated = (outlier_budget > 0 and s.expected is not None
                       and s.expected_fraction >= 1 - outlier_budget and s.rel_error <= rtol)
    found: list[Label] = [s.found for s in slots]
    kind, offset, at = _classify(slots, train, n)
    # a uniform shift is the simpler explanation where both fit; ids_ignored explains the rest
    if kind not in ("ok", "offset", *_ENGINE_BUGS) and _ignored_ids(found, train, n, engine_convention,
                                                                     config_ids):
        kind, offset = "ids_ignored", None
        at = next((s.slot for s in slots if not s.exact), None)
    consistent = _consistent(config_ids, found, n)
    conv_name = get_convention(engine_convention).name if engine_convention else None

    suggested: list[int] | None = None
    fix = ""
    if kind == "ok":
        fix = "The engine hands the draft exactly the boundaries training used."
    elif kind in _ENGINE_BUGS:
        fix = "This is an engine bug, not a config problem; no id list fixes it."
    elif conv_name is None:
        fix = "Name the engine's convention to get the id list that fixes this."
    else:
        try:
            suggested = list(boundaries_to_ids(train, conv_name, n))
            fix = f"Set eagle_aux_hidden_state_layer_ids to {suggested} for {conv_name}."
            if kind == "ids_ignored":
                fix = (f"The engine must read the ids: put eagle_aux_hidden_state_layer_ids: "
                       f"{suggested} where {conv_name} reads it (for vLLM's V2 runner, at the top "
                       f"level of the draft config).")
        except LayerIdError as err:
            fix = f"{err}."

    message = _message(kind, offset, at, slots, train, n, consistent, config_ids) + " " + fix
    return Diagnosis(kind=kind, message=message, engine_boundaries=found, training_boundaries=train,
                     suggested_layer_ids=suggested, slots=slots, engine_convention=conv_name,
                     consistent_conventions=consistent, num_layers=n, offset=offset,
                     details={"rtol": rtol, "outlier_budget": outlier_budget,
                              "num_prompts": len(features),
                              "engine_slots": len(slots), "training_slots": len(train)})


def _message(kind: str, offset: int | None, at: int | None, slots: list[SlotMatch],
             train: list[int], n: int, consistent: list[str],
             config_ids: Sequence[int] | None) -> str:
    if kind == "ok":
        return f"all {len(slots)} slots match training boundaries {train}."
    parts = []
    if at is not None and at < len(slots):
        s = slots[at]
        what = _phrase(s.found, n)
        if kind == "stale_or_skipped":
            what = (f"boundary {s.expected} on {s.expected_fraction:.0%} of tokens, "
                    f"{s.zero_fraction:.0%} zeros, the rest stale")
        elif s.match_fraction < 1 and s.found is not None:
            what += f" on {s.match_fraction:.0%} of tokens"
        parts.append(f"slot {at} is {what}, training used boundary {train[at]} "
                     f"({short_boundary(train[at], n)})" if at < len(train) else
                     f"slot {at} is {what}, a slot training never had")
    if len(slots) != len(train):
        missing = [b for b in train if b not in [s.found for s in slots]]
        parts.append(f"the engine handed {len(slots)} slots, training used {len(train)}"
                     + (f" (boundaries {missing} never arrived)" if missing else ""))
    head = "; ".join(parts)
    if kind == "offset":
        assert offset is not None
        later = "later" if offset > 0 else "earlier"
        names = {0: "the embedding", n: "the final boundary"}
        held = {t: s.found for t, s in zip(train, slots, strict=False)}
        kept = [e for e in names if held.get(e) == e]
        cause = (f"offset {offset:+d} — every slot"
                 + (f" but {' and '.join(names[e] for e in kept)}" if kept else "")
                 + f" is {abs(offset)} boundar{'y' if abs(offset) == 1 else 'ies'} {later} than training")
        if 0 in train and 0 not in kept:
            cause += ", and the embedding is lost with it"
    else:
        cause = _CAUSE[kind]
    msg = f"{head}; root cause: {cause}." if head else f"root cause: {cause}."
    found = [s.found for s in slots]
    msg += f" Engine slots hold {found}, training used {train}."
    if consistent and config_ids is not None:
        msg += f" The engine read ids {list(config_ids)} as {' / '.join(consistent)} would."
    return msg


# -- fc-level and vocab-level kinds (the checks decide when) ----------------------------------


def worst_tokens(features: Sequence[torch.Tensor], golden: Sequence[torch.Tensor],
                 rtol: float) -> tuple[int, int, float]:
    """(bad tokens, total tokens, worst relative error): judged per token, because a bug that
    touches a few positions (a rollback, a ragged batch) vanishes in a whole-prompt norm."""
    bad = total = 0
    worst = 0.0
    for x, ref in zip(features, golden, strict=True):
        err = relative_errors(x, ref)
        bad += int((err > rtol).sum())
        total += err.numel()
        worst = max(worst, float(err.max())) if err.numel() else worst
    return bad, total, worst


@dataclass(frozen=True)
class FcVerdict:
    """The fc check's finding, shared by the fc suite and the acceptance explainer so that
    both judge the projection by one criterion."""

    bad: int
    total: int
    worst: float
    message: str
    diagnosis: Diagnosis | None  # None exactly when ok

    @property
    def ok(self) -> bool:
        return self.bad == 0


def judge_fc(fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
             expected: Sequence[torch.Tensor], rtol: float, *, draft_hidden: int,
             norm_before_fc: bool, fc_norm: bool) -> FcVerdict:
    """Did the engine's fc output equal fc(the engine's own features), token by token? Judged
    on the engine's features so that a capture bug does not masquerade as an fc bug."""
    bad, total, worst = worst_tokens(fc_out, expected, rtol)
    if not bad:
        return FcVerdict(0, total, worst, "fc output matches fc(features)", None)
    width = int(features[0].shape[-1])
    detail = (f"the draft's fc output differs from fc(features) on {bad}/{total} tokens "
              f"(worst relative error {worst:.3g}, tolerance {rtol:g})")
    slot = next((s for s in (fc_output_is_raw_input(o, f, rtol)
                             for o, f in zip(fc_out, features, strict=True)) if s is not None), None)
    if slot is not None:
        diag = fc_diagnosis("fc_skipped", f"{detail}; it equals aux slot {slot} unprojected (fc "
                                          f"input width {width}, draft hidden {draft_hidden})",
                            raw_slot=slot)
        return FcVerdict(bad, total, worst, diag.message, diag)
    diag = fc_diagnosis("fc_wrong", f"{detail}; the trained flags are norm_before_fc="
                                    f"{norm_before_fc}, fc_norm={fc_norm}")
    return FcVerdict(bad, total, worst, diag.message, diag)


def fc_output_is_raw_input(fc_out: torch.Tensor, features: torch.Tensor, rtol: float) -> int | None:
    """Which H-wide chunk of the features the engine's "fc output" equals, if any: the
    signature of an engine that skipped fc (it handed the raw aux state on)."""
    hidden = fc_out.shape[-1]
    if features.shape[-1] % hidden:
        return None
    for s in range(features.shape[-1] // hidden):
        chunk = features[:, s * hidden:(s + 1) * hidden].float()
        err = (fc_out.float() - chunk).norm() / chunk.norm().clamp_min(1e-12)
        if err <= rtol:
            return s
    return None


_FC_TEXT = {
    "fc_skipped": (
        "fc skipped — the draft's decoder got the raw aux state instead of fc(aux). Engines that "
        "decide 'apply fc?' by comparing widths skip it whenever num_aux * target_hidden equals "
        "the draft hidden size (e.g. one aux layer), or run an EAGLE-3 draft as EAGLE. Fix in the "
        "engine: apply fc to the aux states on the first draft step unconditionally."),
    "fc_wrong": (
        "fc computed differently from training — not a skipped fc (the output equals no raw aux "
        "slot) but other weights, a dropped or extra norm (norm_before_fc / fc_norm), or a "
        "different slot order inside fc. Fix the engine's fc weight loading and norm flags."),
    "fc_on_recurrent_state": (
        "fc applied to the draft's own recurrent state — training applies fc once, on the first "
        "draft step; later steps feed the draft's H-wide pre-norm output straight in. Fix in the "
        "engine: skip fc after the first draft step."),
    "d2t_absolute": (
        "d2t read as absolute target ids — SpecForge's d2t holds offsets (target id = i + d2t[i]); "
        "read as ids, every drafted token maps to the wrong target token. Fix the engine's "
        "draft-to-target mapping, or convert d2t when loading."),
    "draft_kv_not_rolled_back": (
        "draft KV not rolled back — after a verify step rejects drafted tokens, their entries stay "
        "in the draft's KV cache, so later drafts attend to tokens that were never accepted. Fix "
        "in the engine: truncate the draft cache to the accepted prefix."),
}


def fc_diagnosis(kind: str, detail: str = "", **details: Any) -> Diagnosis:
    """A Diagnosis for a bug seen past the capture: in fc, the vocab map or the draft cache."""
    if kind not in _FC_TEXT:
        raise ValueError(f"unknown fc-level kind {kind!r}; use one of {sorted(_FC_TEXT)}")
    message = (f"{detail.rstrip('.')}; root cause: " if detail else "root cause: ") + _FC_TEXT[kind]
    return Diagnosis(kind=kind, message=message, engine_boundaries=[], training_boundaries=[],
                     suggested_layer_ids=None, details=details)


def fc_skipped_diagnosis(detail: str = "", **details: Any) -> Diagnosis:
    return fc_diagnosis("fc_skipped", detail, **details)


def fc_on_recurrent_state_diagnosis(detail: str = "", **details: Any) -> Diagnosis:
    return fc_diagnosis("fc_on_recurrent_state", detail, **details)


def d2t_absolute_diagnosis(detail: str = "", **details: Any) -> Diagnosis:
    return fc_diagnosis("d2t_absolute", detail, **details)


def draft_kv_not_rolled_back_diagnosis(detail: str = "", **details: Any) -> Diagnosis:
    return fc_diagnosis("draft_kv_not_rolled_back", detail, **details)


_SHAPES = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")


def crash_diagnosis(message: str, config_ids: Sequence[int], target_hidden: int) -> Diagnosis:
    """An engine that fails on a draft is nonconformant too; name why where the error shows it.

    A matmul shape error whose fed width is a multiple of the target hidden size smaller than
    fc's input means aux slots went missing: an id matched no layer (a negative id, e.g. the
    "-1 = embedding" style, in an engine that has no such id)."""
    m = _SHAPES.search(message)
    first = message.strip().splitlines()[0] if message.strip() else "engine failure"
    if m and int(m.group(2)) % target_hidden == 0 and int(m.group(3)) % target_hidden == 0:
        fed, want = int(m.group(2)) // target_hidden, int(m.group(3)) // target_hidden
        if fed < want:
            dropped = [i for i in config_ids if i < 0]
            kind = "embedding_missing" if dropped else "engine_crash"
            why = (f"ids {dropped} match no layer in this engine, so their slots are dropped"
                   if dropped else "some ids match no captured layer")
            return Diagnosis(kind=kind, message=(
                f"the engine fed fc {fed} aux states where the draft's fc takes {want} ({why}) and "
                f"crashed: {first}. Training fed the embedding output there; this engine cannot "
                f"express it with these ids."), engine_boundaries=[], training_boundaries=[],
                suggested_layer_ids=None, details={"fed_slots": fed, "fc_slots": want})
        if fed > want:
            return Diagnosis(kind="ids_ignored", message=(
                f"the engine fed fc {fed} aux states where the draft's fc takes {want} and crashed: "
                f"{first}. It captured more layers than the config's ids {list(config_ids)} name, "
                f"so it took its layer list from elsewhere (an engine that ignores the ids captures "
                f"its default three)."), engine_boundaries=[], training_boundaries=[],
                suggested_layer_ids=None, details={"fed_slots": fed, "fc_slots": want})
    return Diagnosis(kind="engine_crash", message=f"the engine failed serving this draft: {first}",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None)
