"""The diagnosis record every check attaches to a failure (and report.json carries): its kind,
its one-paragraph message, and for capture kinds what each engine slot held.

Plain data, no torch: the report and the crash parser build and read it without tensors.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# engine_cannot_express: the engine refused the wiring by a rule of its own (harness.diagnosis.crash)
CRASH_KINDS = ("engine_crash", "engine_cannot_express", "hang")
VALUE_KINDS = ("non_finite",)  # harness.judgement.finite
CAPTURE_KINDS = ("ok", "offset", "embedding_missing", "order_permuted", "final_boundary_normed",
                 "final_boundary_missing", "residual_missing", "stale_or_skipped", "ids_ignored",
                 "slots_aliased", "precision_loss", "normalised", "partial_residual",
                 "position_shifted", "request_mixed", "slots_interleaved", "batch_dependent",
                 "capture_shard", "capture_missing_rank", "unrecognised")
DRAFT_SIDE_KINDS = ("fc_skipped", "fc_wrong", "fc_on_recurrent_state", "d2t_absolute",
            "draft_kv_not_rolled_back")
DECODE_KINDS = ("decode_misaligned", "draft_positions_shifted", "history_dependent")  # diagnosis.decode
THROUGHPUT_KINDS = ("speculation_overhead",)
KINDS = (CAPTURE_KINDS + DRAFT_SIDE_KINDS + DECODE_KINDS + CRASH_KINDS + VALUE_KINDS
         + THROUGHPUT_KINDS)

# whom a remedy is for (Diagnosis.details["addressee"], report.json's diagnoses[].addressee)
ENGINE_VENDOR = "engine vendor"
DRAFT_OWNER = "draft owner"
UNDETERMINED = "undetermined"

FINAL_NORMED = "final_normed"
ZERO = "zero"
# reduced precision only: a token no golden state is clearly nearest to (none `separation`
# times nearer than the runner-up): precision cannot say what it is, so it is evidence of nothing
AMBIGUOUS = "ambiguous"


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
    # per golden boundary 0..N, this slot's mean per-token relative error to it (capped at 10):
    # the row of the report's slot-by-boundary heatmap; carried in Diagnosis.details, not here
    boundary_errors: list[float] = field(default_factory=list, repr=False)

    @property
    def exact(self) -> bool:
        return self.expected is not None and self.expected_fraction == 1.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["token_labels"] = {str(k): v for k, v in self.token_labels.items()}
        out.pop("boundary_errors")  # in Diagnosis.details["slot_boundary_errors"]; slots keep their keys
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
            # who the remedy is for ("engine vendor", "draft owner"): issue #31, item 3
            "addressee": self.details.get("addressee"),
            "slots": [s.to_json() for s in self.slots],
            "details": dict(self.details),
        }


def unexplained(diag: Diagnosis | None, failure_text: str, *, reproducer: str | None = None,
                evidence: dict[str, Any] | None = None) -> Diagnosis:
    """The diagnosis of a check that FAILED while the evidence its diagnosis read matched
    training (kind `ok`), or that had no diagnosis at all: `unrecognised`, with the failure's
    own raw evidence and the reproducer. Never `ok` on a failed check (issue #31, item 4): an
    "ok" there would tell the vendor the wiring is right while the check says it is not, and a
    known kind would be a cause chosen by elimination. `diag`'s slots, boundaries and details
    are kept (what the diagnosis read); what it concluded goes to details.read_as."""
    text = failure_text.strip()
    read = ("" if diag is None else
            f" The diagnosis read the evidence as {diag.kind!r} ({diag.message.split(' Confidence')[0]}),"
            " which does not explain this failure.")
    message = (f"root cause: unrecognised — the check failed and no known cause fits the evidence."
               f"{read} Raw evidence: {text.splitlines()[0] if text else '(none)'}"
               + (f" {reproducer}" if reproducer else "") + " Confidence margin: none, no explanation fits.")
    details: dict[str, Any] = {**(diag.details if diag is not None else {}),
                               "raw_evidence": text, "confidence_margin": 0.0,
                               "addressee": "engine vendor"}
    if evidence:
        details["evidence"] = evidence
    if reproducer:
        details["reproducer"] = reproducer
    if diag is not None:
        details["read_as"] = {"kind": diag.kind, "message": diag.message}
    return Diagnosis(kind="unrecognised", message=message,
                     engine_boundaries=[] if diag is None else list(diag.engine_boundaries),
                     training_boundaries=[] if diag is None else list(diag.training_boundaries),
                     suggested_layer_ids=None, slots=[] if diag is None else list(diag.slots),
                     engine_convention=None if diag is None else diag.engine_convention,
                     num_layers=None if diag is None else diag.num_layers, details=details)


def failing_diagnoses(diagnoses: Sequence[Any], failure_text: str,
                      reproducer: str | None = None) -> list[Any]:
    """A failed check's diagnoses with every `ok` among them replaced by `unexplained` (objects
    with a `kind` attribute; anything else, e.g. a plain dict, passes through unless its "kind"
    is "ok")."""
    out: list[Any] = []
    for d in diagnoses:
        kind = d.get("kind") if isinstance(d, dict) else getattr(d, "kind", None)
        if kind != "ok":
            out.append(d)
        elif isinstance(d, Diagnosis):
            out.append(unexplained(d, failure_text, reproducer=reproducer))
        else:
            out.append(unexplained(None, failure_text, reproducer=reproducer,
                                   evidence={"read_as": dict(d) if isinstance(d, dict) else repr(d)}))
    return out
