"""Capture classification: name the one cause that explains what the slots hold (offset,
missing embedding, permuted order, normed final boundary, missing residual, skipped capture,
ignored ids, aliased slots, and the fitted causes of `harness.diagnosis.evidence`) and word it
with the id list that fixes it in the engine's convention. Where no cause fits, the outcome is
`unrecognised` with what each slot was seen to hold: never a known class by elimination.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cache, partial

import torch

from harness.core.boundaries import (
    CONVENTIONS,
    Convention,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
    short_boundary,
)
from harness.core.tolerances import rtol_for
from harness.diagnosis.compare import AMBIGUOUS_MARGIN, Comparison, compare, rival_kind, slot_errors
from harness.diagnosis.evidence import (
    batch_dependence,
    explain,
    label_fit,
    seen_per_slot,
)
from harness.diagnosis.fingerprint import fingerprint
from harness.diagnosis.record import (
    AMBIGUOUS,
    DRAFT_OWNER,
    ENGINE_VENDOR,
    FINAL_NORMED,
    UNDETERMINED,
    ZERO,
    Diagnosis,
    Label,
    SlotMatch,
    mlp_label,
)
from harness.golden.features import TargetFeatures


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
        wrong = sum(v for k, v in s.token_labels.items()
                    if k not in (ZERO, None, AMBIGUOUS, s.expected))
        return rest > 0 and rest >= wrong
    return False


def _classify(slots: list[SlotMatch], train: list[int], n: int) -> tuple[str, int | None, int | None]:
    """(kind, offset, the slot the message should point at)."""
    found = [s.found for s in slots]
    if len(slots) == len(train) and all(s.exact for s in slots):
        return "ok", None, None
    final_exact = any(s.expected == n and s.exact for s in slots)
    for s in slots:
        # A post-norm state in any slot: the engine took its deepest capture after the final
        # norm (wherever training put that slot, no pre-norm boundary equals it) - unless the
        # final boundary itself arrived as trained: then that slot is another normalised state
        # (in reduced precision a layer's input-normed state is identified as the nearest
        # post-norm candidate), which the fitted causes judge
        if s.found == FINAL_NORMED and s.expected is not None and not final_exact:
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
    # slots whose modal states are all as trained are no permutation and no shift, whatever
    # their off tokens are (the fitted causes read those)
    if len(slots) == len(train) and len(ints) == len(found) and ints != train:
        if sorted(ints) == sorted(train):
            return "order_permuted", None, first_bad
        shifts = {f - t for f, t in zip(ints, train, strict=True)}
        if len(shifts) == 1:
            return "offset", shifts.pop(), first_bad
        # a shift that cannot move an endpoint: "-1 = embedding" honoured while every real id
        # shifts, or a +1 that stops at the last layer's output (no boundary beyond N). Both
        # are one-boundary rules; a larger "shift" that leaves an endpoint in place (every slot
        # holding boundary N: [1, 8] -> [8, 8]) is slots sharing one buffer, not a convention
        inner = {f - t for f, t in zip(ints, train, strict=True) if not (f == t and t in (0, n))}
        kept_final = any(f == t == n for f, t in zip(ints, train, strict=True))
        # a -1 moves the last layer's output to N-1 like every other boundary: an engine that
        # reads ids one early has no reason to keep b = N (issue #31: [1, N] held as [0, N] is a
        # fault at boundary 1 alone, not "offset -1")
        if len(inner) == 1 and next(iter(inner)) in (-1, 1) and not (kept_final and -1 in inner):
            return "offset", inner.pop(), first_bad
    aliased = _aliased(slots)
    if aliased is not None:
        return "slots_aliased", None, aliased
    # an endpoint is "missing" only on evidence: its slot holds zeros or another boundary (or
    # never arrived); a slot that matches nothing is not evidence of anything
    if 0 in train and 0 not in found and _holds_other(slots, train.index(0)):
        return "embedding_missing", None, train.index(0) if train.index(0) < len(slots) else first_bad
    if n in train and n not in found and _holds_other(slots, train.index(n)):
        return "final_boundary_missing", None, train.index(n) if train.index(n) < len(slots) else first_bad
    if len(ints) == len(found) < len(train) and set(ints) < set(train):
        # every slot that arrived is right, some never did: capture skipped for those layers
        # (SGLang's two-batch-overlap path captures nothing past the dense layers)
        return "stale_or_skipped", None, None
    return "unrecognised", None, first_bad


def _holds_other(slots: list[SlotMatch], at: int) -> bool:
    """The slot at `at` never arrived, or holds zeros or some other golden boundary."""
    if at >= len(slots):
        return True
    return slots[at].found == ZERO or isinstance(slots[at].found, int)


def _aliased(slots: list[SlotMatch]) -> int | None:
    """The first slot holding the same boundary as an earlier slot where training put
    different boundaries there: several slots share one buffer (the last capture written)."""
    seen: dict[int, SlotMatch] = {}
    for s in slots:
        if isinstance(s.found, int) and s.match_fraction == 1.0:
            first = seen.setdefault(s.found, s)
            if first is not s and first.expected != s.expected:
                return s.slot
    return None


_CAUSE = {
    "embedding_missing": "embedding missing — the engine shifted ids or cannot capture the embedding",
    "final_boundary_missing": "final boundary missing — the engine never captures the last layer's output",
    "final_boundary_normed": "final boundary normed — the engine hands over the last layer's output after the final norm",
    "residual_missing": "residual missing — the engine captures the MLP output without adding the residual back",
    "order_permuted": "order permuted — the right boundaries in the wrong slots",
    "stale_or_skipped": "capture skipped — the engine skips capture for some layers or positions and leaves stale or zero values",
    "ids_ignored": "ids ignored — the engine captured its own default boundaries, not the ids the draft "
                   "config lists (known cases: vLLM's V2 model runner reads a top-level "
                   "eagle_aux_hidden_state_layer_ids or eagle_config.layer_ids, never the nested "
                   "eagle_config.eagle_aux_hidden_state_layer_ids that SpecForge writes, and falls back "
                   "to the model's (2, N//2, N-3); llama.cpp's converter does not read the nested ids "
                   "either and writes its defaults)",
    "slots_aliased": "slots aliased — several slots hold the same state: the engine's capture list "
                     "holds one buffer that every capture overwrites, or copies one slot into all",
    "precision_loss": "precision loss — the right boundaries, rounded: the engine passes the aux "
                      "states through a lower precision than its compute dtype (a bf16/fp16 buffer)",
    "normalised": "normalisation applied — the right boundaries after a normalisation: the engine "
                  "captures inside the layer after its input norm, not the residual stream",
    "partial_residual": "partial residual sum — the residual stream before the MLP's update was "
                        "added: the engine captures `residual` after attention, not hidden + residual",
    "position_shifted": "position shifted — each row holds another position's state: the engine pairs "
                        "features and tokens off by the printed shift",
    "request_mixed": "requests mixed — a request got another request's features: the engine "
                     "indexes its batch rows wrongly when it hands the aux states over",
    "slots_interleaved": "slots interleaved — the right states in the wrong memory layout: the engine "
                         "stacks its slots and flattens [T, H, n] where training concatenates [T, n, H]",
    "batch_dependent": "batch-dependent capture — right for a prompt alone, wrong in a batch: the "
                       "engine's padding, packing or a batch-wide reduction leaks into the aux states",
    "unrecognised": "unrecognised — no known cause fits the evidence; what each slot holds is listed",
}
_FITTED = ("precision_loss", "normalised", "partial_residual", "position_shifted", "request_mixed",
           "slots_interleaved", "batch_dependent")
_ENGINE_BUGS = ("final_boundary_normed", "residual_missing", "stale_or_skipped", "slots_aliased",
                *_FITTED)
# causes read off per-slot labels that no fitted model can overturn
_LABELLED = ("ok", "final_boundary_normed", "residual_missing", "offset", "order_permuted")
# causes whose confidence is their margin over the competing explanations of
# harness.diagnosis.compare (the fitted causes carry their own fit-against-raw margin)
_COMPARED = ("offset", "embedding_missing", "order_permuted", "final_boundary_normed",
             "final_boundary_missing", "residual_missing", "slots_aliased", "ids_ignored")


def _ignored_ids(found: list[Label], train: list[int], n: int,
                 engine_convention: str | Convention | None,
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


def _labels_loose(fit: tuple[float, float], rtol: float) -> bool:
    """Whether, in reduced precision, the slot labels fall short of naming the slots' states
    (fit: evidence.label_fit's margin and farthest labelled slot): a labelled slot whose median
    token is nearer another state (margin < 1), or farther from its labelled state than the
    tolerance of a reduced-precision capture (rtol: at most that far from its own boundary on
    the median token; harness.core.tolerances.REASONS['rtol'])."""
    margin, farthest = fit
    return margin < 1 or farthest > rtol


def diagnose_capture(
    features: Sequence[torch.Tensor],
    golden: Sequence[TargetFeatures],
    training_boundaries: Sequence[int],
    *,
    engine_convention: str | Convention | None = None,
    config_ids: Sequence[int] | None = None,
    rtol: float = rtol_for("float32"),
    separation: float = 0.0,
    alone: Sequence[torch.Tensor] | None = None,
    judged_off: bool = False,
) -> Diagnosis:
    """Name the root cause of an aux-feature mismatch.

    features: per prompt, what the engine handed the draft, [T, n*H] in engine slot order;
    golden: the fp32 training-time features of the same prompts; training_boundaries: the
    boundaries training put in each slot; engine_convention: a key of CONVENTIONS or an
    adapter's own Convention, to word the fix as an id list; config_ids: the draft config's
    ids, to say which convention the engine behaved like; rtol: per-token relative tolerance;
    separation: > 0 in reduced precision, where a token beyond rtol is labelled by the state
    it is identified as (see `harness.core.tolerances`), so precision noise never reads as a
    skipped capture; alone: per prompt, the engine's features of that prompt captured on its
    own (evidence for a batch-dependent capture); judged_off: the reduced-precision judgement
    (harness.diagnosis.identity) failed a capture whose slot labels are all as trained, so the
    fitted causes are still looked for (a batch leak or a rescale can keep every token nearest
    its own boundary while moving it past the noise floor).
    """
    n = golden[0].num_layers
    train = [int(b) for b in training_boundaries]
    slots = fingerprint(features, golden, train, rtol, separation)
    found: list[Label] = [s.found for s in slots]
    kind, offset, at = _classify(slots, train, n)
    # how well the slot labels fit: read by the reduced-precision branch below and by the
    # confidence margin of a cause read off labels; computed at most once
    fit = cache(partial(label_fit, features, golden, found, rtol))
    finding = None
    if kind not in _LABELLED or (kind == "ok" and judged_off):
        finding = explain(features, golden, train, rtol, alone, separation)
    elif separation > 0 and kind != "ok" and _labels_loose(fit(), rtol):
        # reduced precision: slot labels that another state fits better on the median token,
        # or that are only the nearest golden state and not the slot's (a normalised state
        # nearest the final norm's output, a residual without its MLP update nearest the
        # embedding), are no evidence for the cause read off them; a fitted cause that fits
        # every token takes its place
        finding = explain(features, golden, train, rtol, alone, separation)
    elif alone is not None and kind != "ok":
        # a cause read off the slot labels stands (a normed final slot is not "normalised");
        # solo captures can only add that the capture depends on the batch
        finding = batch_dependence(features, alone, golden, train, rtol, separation)
    if finding is not None:
        kind, offset, at = finding.kind, None, None
    # a uniform shift is the simpler explanation where both fit; ids_ignored explains the rest
    if kind not in ("ok", "offset", *_ENGINE_BUGS) and _ignored_ids(found, train, n, engine_convention,
                                                                     config_ids):
        kind, offset = "ids_ignored", None
        at = next((s.slot for s in slots if not s.exact), None)
    consistent = _consistent(config_ids, found, n)
    conv = get_convention(engine_convention) if engine_convention else None
    conv_name = conv.name if conv else None

    suggested: list[int] | None = None
    fix = ""
    addressee: str | None = ENGINE_VENDOR
    if kind == "ok":
        fix, addressee = "The engine hands the draft exactly the boundaries training used.", None
    elif kind in _ENGINE_BUGS or kind == "unrecognised":
        fix = "This is an engine bug, not a config problem; no id list fixes it."
    elif conv is None:
        fix = "Name the engine's convention to get the id list that fixes this."
        addressee = UNDETERMINED
    else:
        try:
            suggested = list(boundaries_to_ids(train, conv, n))
            fix, addressee = f"Set eagle_aux_hidden_state_layer_ids to {suggested} for {conv_name}.", DRAFT_OWNER
            if kind == "ids_ignored":
                fix = (f"The engine must read the ids: put eagle_aux_hidden_state_layer_ids: "
                       f"{suggested} where {conv_name} reads it (for vLLM's V2 runner, at the top "
                       f"level of the draft config).")
            elif config_ids is not None and suggested == [int(i) for i in config_ids]:
                # the config already says training's boundaries in the engine's own declared
                # convention: setting "the right ids" changes nothing; the engine's capture
                # does not do what it declares (issue #31, item 3)
                fix, suggested = _capture_fault(kind, offset, found, train, conv, list(config_ids)), None
                addressee = ENGINE_VENDOR
        except LayerIdError as err:
            fix = f"{err}."
    fix = f"{_TO[addressee]}{fix}" if addressee else fix

    details: dict = {"addressee": addressee,
                     "rtol": rtol, "separation": separation, "num_prompts": len(features),
                     "engine_slots": len(slots), "training_slots": len(train),
                     "slot_boundary_errors": [s.boundary_errors for s in slots]}
    message = _message(kind, offset, at, slots, train, n, consistent, config_ids)
    if finding is not None:
        details.update(evidence=finding.data, confidence_margin=finding.margin)
        message += f" Evidence: {finding.seen}."
        if finding.runner_up is not None:
            details["comparison"] = {"winner": kind, "runner_up": finding.runner_up,
                                     "margin": finding.margin,
                                     "ambiguous": finding.margin < AMBIGUOUS_MARGIN,
                                     "experiment": finding.experiment}
        if finding.runner_up is not None and finding.margin < AMBIGUOUS_MARGIN:
            details["ambiguous_with"] = finding.runner_up
            message = message.replace("root cause:", "likeliest cause, not separated from "
                                      f"{finding.runner_up}:", 1)
            message += (f" Ambiguous between {kind} and {finding.runner_up} (margin "
                        f"{finding.margin:.3g}: the evidence fits both); the experiment that "
                        f"separates them: {finding.experiment}.")
            fix = f"If it is {kind}: {fix}"
    elif kind == "unrecognised":
        seen = seen_per_slot(features, golden, train, rtol)
        details.update(seen=seen, confidence_margin=0.0)
        message += " Seen per slot: " + "; ".join(
            f"slot {d['slot']} (training b={d['expected']}) nearest "
            + ", ".join(f"{c['state']} at {c['median_rel_error']:.3g}" for c in d["nearest"])
            + (f", off at (prompt, token) {d['first_off_tokens']}" if d["first_off_tokens"] else "")
            for d in seen) + "."
    elif kind != "ok":
        details["confidence_margin"] = fit()[0]
    comparison: Comparison | None = None
    if finding is None and kind in _COMPARED:
        comparison = compare(kind, offset, slot_errors(features, golden, train), found, train, n,
                             floor=rtol, engine_convention=conv_name)
    if comparison is not None:
        details.update(confidence_margin=comparison.margin, comparison=comparison.to_json())
        if comparison.ambiguous:
            assert comparison.runner_up is not None
            details["ambiguous_with"] = comparison.runner_up.name
            message = message.replace("root cause:", "likeliest cause, not separated from "
                                      f"{comparison.runner_up.name}:", 1)
            fix = f"If it is {comparison.winner.name}: {fix}"
        message += comparison.sentence()
    elif "confidence_margin" in details and kind != "ok" and "ambiguous_with" not in details:
        m = details["confidence_margin"]
        message += (" Confidence margin: none, no explanation fits." if m == 0 else
                    f" Confidence margin: the nearest competing explanation fits {m:.3g}x worse.")
    message += " " + fix
    return Diagnosis(kind=kind, message=message, engine_boundaries=found, training_boundaries=train,
                     suggested_layer_ids=suggested, slots=slots, engine_convention=conv_name,
                     consistent_conventions=consistent, num_layers=n, offset=offset, details=details)


_TO = {ENGINE_VENDOR: "For the engine vendor: ", DRAFT_OWNER: "For the draft owner: ",
       UNDETERMINED: "For the engine vendor or the draft owner: "}


def _capture_fault(kind: str, offset: int | None, found: list[Label], train: list[int],
                   conv: Convention, config_ids: list[int]) -> str:
    """What an engine does that captures other boundaries than the convention it declares
    says its config's ids mean: the fault is its capture, and the sentence says where."""
    head = (f"the engine declares {conv.name} ({conv.description}); under it the config's ids "
            f"{config_ids} already mean training's boundaries {train}, yet it captures {found}")
    if kind == "offset" and offset is not None:
        where = {1: "its hook reads the layer's output, not its input",
                 -1: "its hook reads the layer's input, not its output (one layer early)"}.get(
            offset, f"its hook sits {abs(offset)} layers {'later' if offset > 0 else 'earlier'} "
                    "than its convention says")
        return (f"{head[0].upper()}{head[1:]}: it captures boundary b{offset:+d} for the id that "
                f"means b: {where}. The fault is in the engine's capture, not in the config: "
                "move the hook so that id k captures what the declared convention says (or "
                "declare the convention the engine implements).")
    return (f"{head[0].upper()}{head[1:]}. The fault is in the engine's capture, not in the "
            f"config: no id change is needed for a draft that already states them in {conv.name}.")


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


def name_boundaries(found: Sequence[int], train: Sequence[int], n: int) -> tuple[str, int | None, str]:
    """The capture kind, signed offset and message for slots whose boundaries are known exactly,
    without tensors: what a converted draft's ids mean to the engine it is for, against what the
    source's ids meant to its trainer (harness.tools.convert_check). The same classification and
    wording as a measured capture, so a conversion's finding reads as `run`'s would."""
    train = [int(b) for b in train]
    slots = [SlotMatch(slot=i, expected=train[i] if i < len(train) else None, found=int(b),
                       match_fraction=1.0, zero_fraction=0.0, rel_error=float("nan"),
                       cosine=float("nan"),
                       expected_fraction=float(i < len(train) and int(b) == train[i]))
             for i, b in enumerate(found)]
    kind, offset, at = _classify(slots, train, n)
    return kind, offset, _message(kind, offset, at, slots, train, n, [], None)


def embedding_only(diag: Diagnosis) -> bool:
    """A capture whose every trained slot is the embedding, found shifted or missing: from its
    slots alone "every slot one boundary later" and "the embedding dropped" fit equally (a
    failing layer-id example shrinks to exactly this, ids meaning [0]). Also any capture the
    model comparison left ambiguous between exactly these two (the embedding and the final
    boundary, [0, N] held as [1, N]: a shift that leaves the final boundary in place fits as
    well as a dropped embedding)."""
    pair = {"offset", "embedding_missing"}
    if diag.kind not in pair or not diag.training_boundaries:
        return False
    return set(diag.training_boundaries) == {0} or {diag.kind, rival_kind(diag)} == pair


def embedding_or_shift(diag: Diagnosis, probe: Diagnosis) -> Diagnosis:
    """Separate the two causes `embedding_only` cannot, with a probe served the same way whose
    slots are the embedding and a middle boundary: a middle slot shifted too is the offset, an
    exact middle slot with the embedding off is the lost embedding. A probe showing anything
    else leaves the diagnosis as it was (the evidence does not decide)."""
    if probe.kind == "offset":
        kind, offset = "offset", probe.offset
    elif probe.kind == "embedding_missing":
        kind, offset = "embedding_missing", None
    else:
        return diag
    cause = (f"offset {probe.offset:+d} — every boundary is read {abs(probe.offset or 0)} off, the "
             "embedding with it" if kind == "offset" else
             "embedding missing — only the embedding slot is off; later boundaries are captured "
             "as trained")
    held = ("the slots trained on the embedding hold" if set(diag.training_boundaries) == {0}
            else f"the slots trained on {list(diag.training_boundaries)} hold")
    message = (f"{held} {list(diag.engine_boundaries)}, which alone "
               f"fits both a shift of every id and a dropped embedding; a probe served the same "
               f"way with boundaries {list(probe.training_boundaries)} holds "
               f"{list(probe.engine_boundaries)}. root cause: {cause}. Probe: {probe.message}")
    return _decided(diag, probe, kind, offset, message)


def _decided(diag: Diagnosis, probe: Diagnosis, kind: str, offset: int | None,
             message: str) -> Diagnosis:
    """`diag` as the probe decided it: no longer ambiguous, the probe's margin its own, the
    probe kept as its evidence; an id list suggested only for a shift."""
    return replace(diag, kind=kind, offset=offset, message=message,
                   suggested_layer_ids=diag.suggested_layer_ids if kind == "offset" else None,
                   details={**{k: v for k, v in diag.details.items() if k != "ambiguous_with"},
                            "probe": probe.to_json(), "separated_by": "probe",
                            "confidence_margin": probe.details.get("confidence_margin",
                                                                   diag.details.get("confidence_margin"))})


# the causes a fault at one boundary alone is named by (harness.diagnosis.compare._local_kind)
_LOCAL = ("embedding_missing", "final_boundary_missing", "final_boundary_normed",
          "residual_missing", "stale_or_skipped", "unrecognised")


def separating_probe(diag: Diagnosis, n: int) -> tuple[int, ...] | None:
    """The boundaries of the draft that separates what `diag` could not, where it is one the
    layer-id check can serve; None where `diag` is decided or its ambiguity is of another kind.
    A shift of every id and a fault at one boundary alone predict the same slots wherever only
    one slot is off (a failing example shrinks to one id): a probe with that boundary and a
    middle one tells them apart, a shifted reading moving the middle slot too."""
    if embedding_only(diag):
        return (0, n // 2)
    rival = rival_kind(diag)
    kinds = {diag.kind, rival}
    mechanism = kinds & {"offset", "slots_aliased"}
    if rival is None or len(mechanism) != 1 or not (kinds - mechanism) <= set(_LOCAL):
        return None
    off = [s for s, (held, b) in enumerate(zip(diag.engine_boundaries, diag.training_boundaries,
                                                strict=False)) if held != b]
    if len(off) != 1 or len(diag.engine_boundaries) != len(diag.training_boundaries):
        return None
    b = int(diag.training_boundaries[off[0]])
    if mechanism == {"slots_aliased"}:
        # one buffer shared by every slot is right for a draft of one slot; a fault at that
        # boundary repeats alone
        return (b,)
    middle = next(m for m in (n // 2, n // 2 - 1, n // 2 + 1) if m not in (0, n, b))
    return (b, middle)


def shift_or_local(diag: Diagnosis, probe: Diagnosis) -> Diagnosis:
    """`diag` decided by the probe `separating_probe` asked for: the probe's middle slot shifted
    with the rest is the offset; the probe's first slot holding what `diag`'s off slot held with
    the middle slot as trained is the fault at that one boundary. A probe showing anything else
    leaves `diag` as it was (the evidence does not decide)."""
    if embedding_only(diag):  # the probe separating_probe asked for here is [0, N//2]
        return embedding_or_shift(diag, probe)
    kinds = (diag.kind, rival_kind(diag))
    local = next((k for k in kinds if k not in ("offset", "slots_aliased")), None)
    held_b = [(h, b) for h, b in zip(diag.engine_boundaries, diag.training_boundaries, strict=False)
              if h != b]
    if local is None or not held_b:
        return diag
    held, b = held_b[0]
    fault = (f"a capture fault at boundary {b} alone (the engine hands {held} for it)"
             if local == "unrecognised" else _CAUSE.get(local, local))
    pb, pe = list(probe.training_boundaries), list(probe.engine_boundaries)
    aliased = "slots_aliased" in kinds
    if aliased and pb == [b] and pe == pb:
        kind, offset = "slots_aliased", None
        cause = f"{_CAUSE['slots_aliased']}; boundary {b} served alone is captured as trained"
    elif aliased and pb == [b] and pe == [held]:
        kind, offset = local, None
        cause = f"{fault}; served alone, boundary {b} still holds {held}"
    elif aliased:
        return diag
    elif probe.kind == "offset" and probe.offset is not None:
        kind, offset = "offset", probe.offset
        cause = f"offset {probe.offset:+d} — every boundary is read {abs(probe.offset)} off"
    elif len(pe) == 2 and pe[0] == held and pe[1] == pb[1]:
        kind, offset = local, None
        cause = f"{fault}; at boundary {b} only: the probe's other boundary {pb[1]} is captured as trained"
    else:
        return diag
    other = "one buffer shared by every slot" if aliased else "a shift of every id"
    message = (f"the slots trained on {list(diag.training_boundaries)} hold "
               f"{list(diag.engine_boundaries)}, which alone fits both {other} and a "
               f"fault at that one boundary; a probe served the same way with boundaries {pb} "
               f"holds {pe}. root cause: {cause}. Probe: {probe.message}")
    return _decided(diag, probe, kind, offset, message)
