"""Diagnosis as model comparison, for the capture causes read off slot labels (issue #31).

A cause is named because its fingerprint fits the slots, but another explanation can fit the
same evidence as well: one slot one boundary early is "every id read one off" and also "this
one boundary captured wrong"; a slot holding the embedding where training put boundary 1 is
that boundary's fault, not a shift, when the final slot stayed where it was. So every candidate
explanation states what it predicts each slot holds (a golden state, per slot), is scored on
the slots' own tokens (the worst slot's median relative error to its predicted state, floored
at the tolerance: below it, every fit is as good as the dtype can tell), and the confidence
printed is the winner's MARGIN over the runner-up: the runner-up's score over the winner's.

Occam's rule keeps the comparison honest: an explanation that gives each off slot its own
fault can fit any capture, so only candidates with at most as many free choices as the winner
compete with it (an offset is one choice for every slot; a fault at one boundary is one choice
for one slot). A margin below `AMBIGUOUS_MARGIN` prints "ambiguous between X and Y" and names
the experiment that separates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.boundaries import CONVENTIONS, LayerIdError, get_convention, short_boundary
from harness.diagnosis.fingerprint import candidates, relative_errors
from harness.diagnosis.record import AMBIGUOUS, FINAL_NORMED, ZERO, Label, mlp_label
from harness.golden.features import TargetFeatures

# Two explanations whose worst-slot errors are within this factor of each other are not told
# apart by the evidence: the same factor the reduced-precision identity uses to call a token
# the state it is nearest to (harness.core.tolerances.REASONS['separation']: 2 is what the
# triangle inequality guarantees between a state and its neighbours).
AMBIGUOUS_MARGIN = 2.0
SHIFTS = (1, -1, 2, -2, 3, -3)


@dataclass(frozen=True)
class Explanation:
    """One candidate cause: its printed name, its kind, what it predicts each slot holds, how
    many free choices it makes (its complexity) and its score on the evidence."""

    name: str
    kind: str
    predicted: tuple[Label, ...]
    free: int
    error: float
    offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "predicted": [str(p) for p in self.predicted],
                "free": self.free, "error": self.error}


@dataclass
class Comparison:
    """The winner, its runner-up among the explanations as simple as it, the margin (runner-up
    score / winner score), whether that is too small to choose, and the separating experiment."""

    winner: Explanation
    runner_up: Explanation | None
    margin: float
    experiment: str | None
    ranked: list[Explanation] = field(default_factory=list)

    @property
    def ambiguous(self) -> bool:
        return self.runner_up is not None and self.margin < AMBIGUOUS_MARGIN

    def sentence(self) -> str:
        """The confidence as the report prints it."""
        if self.runner_up is None:
            return " Confidence margin: no competing explanation fits the slots."
        if self.ambiguous:
            return (f" Ambiguous between {self.winner.name} and {self.runner_up.name} (margin "
                    f"{self.margin:.3g}: the evidence fits both); the experiment that separates "
                    f"them: {self.experiment}.")
        return (f" Confidence margin: {self.margin:.3g} (the runner-up, {self.runner_up.name}, "
                f"fits {self.margin:.3g}x worse).")

    def to_json(self) -> dict[str, Any]:
        return {"winner": self.winner.name, "runner_up": None if self.runner_up is None else
                self.runner_up.name, "margin": self.margin, "ambiguous": self.ambiguous,
                "experiment": self.experiment, "candidates": [e.to_json() for e in self.ranked[:6]]}


def slot_errors(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                train: Sequence[int]) -> list[dict[Label, float]]:
    """Per engine slot, the median (over every token of every prompt) relative error to each
    candidate state, and to zeros (the slot's norm over its trained boundary's)."""
    hidden = golden[0].boundaries.shape[-1]
    width = int(features[0].shape[-1])
    out: list[dict[Label, float]] = []
    for s in range(width // hidden):
        errs, zero = [], []
        labels: list[Label] = []
        for x, g in zip(features, golden, strict=True):
            labels, states = candidates(g)
            chunk = x.float()[:, s * hidden:(s + 1) * hidden]
            errs.append(relative_errors(chunk[None], states))
            ref = g.boundaries[train[s] if s < len(train) else g.num_layers].float()
            zero.append(chunk.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12))
        med = torch.cat(errs, dim=1).median(dim=1).values
        row: dict[Label, float] = {lab: float(med[i]) for i, lab in enumerate(labels)}
        row[ZERO] = float(torch.cat(zero).median())
        out.append(row)
    return out


def _score(errors: list[dict[Label, float]], predicted: Sequence[Label], floor: float) -> float:
    """The worst slot's error to its predicted state, floored at the tolerance; a capture with
    another number of slots than predicted fits nothing."""
    if len(predicted) != len(errors):
        return float("inf")
    return max(max(errors[s].get(p, float("inf")), floor) for s, p in enumerate(predicted))


def _local_kind(train_b: int, held: Label, n: int) -> str:
    """The named cause of a fault at one boundary alone, where it has a name."""
    if train_b == 0:
        return "embedding_missing"
    if held == FINAL_NORMED:
        return "final_boundary_normed"
    if held == mlp_label(train_b):
        return "residual_missing"
    if train_b == n:
        return "final_boundary_missing"
    if held == ZERO:
        return "stale_or_skipped"
    return "unrecognised"


def _local_name(kind: str, train_b: int, held: Label, n: int) -> str:
    if kind == "unrecognised":
        what = "zeros" if held == ZERO else (f"boundary {held}" if isinstance(held, int) else str(held))
        return (f"a capture fault at boundary {train_b} ({short_boundary(train_b, n)}) alone "
                f"(the engine hands {what} for it)")
    return kind


def explanations(errors: list[dict[Label, float]], found: Sequence[Label], train: Sequence[int],
                 n: int, floor: float, engine_convention: str | None = None) -> list[Explanation]:
    """Every candidate cause of the label-read kinds, scored: as trained; every uniform shift
    (with the embedding kept, "-1 = embedding" honoured, as a variant); the observed order as a
    permutation; every slot holding one state (aliased); the engine's default boundaries
    (ids ignored); and a fault at each single boundary alone (named where it has a name:
    embedding missing, final normed or missing, residual missing, skipped)."""
    train_t = tuple(int(b) for b in train)
    out: list[Explanation] = []

    def add(name: str, kind: str, predicted: Sequence[Label], free: int, offset: int | None = None) -> None:
        pred = tuple(predicted)
        if any(e.predicted == pred and e.kind == kind for e in out):
            return
        out.append(Explanation(name, kind, pred, free, _score(errors, pred, floor), offset))

    add("as trained", "ok", train_t, 0)
    for d in SHIFTS:
        shifted = tuple(min(max(b + d, 0), n) for b in train_t)
        add(f"offset {d:+d}", "offset", shifted, 1, d)
        if 0 in train_t:
            add(f"offset {d:+d}", "offset", tuple(0 if b == 0 else s for b, s in zip(train_t, shifted,
                                                                                  strict=True)), 1, d)
    ints = [f for f in found if isinstance(f, int)]
    if len(ints) == len(found) == len(train_t) and sorted(ints) == sorted(train_t) and tuple(ints) != train_t:
        add("order_permuted", "order_permuted", tuple(ints), 1)
    for b in sorted(set(ints)):
        if len(train_t) > 1:
            add(f"slots_aliased (every slot holds boundary {b})", "slots_aliased", (b,) * len(train_t), 1)
    names = [engine_convention] if engine_convention else list(CONVENTIONS)
    for c in names:
        try:
            default = tuple(get_convention(c).default_boundaries(n))
        except (LayerIdError, ValueError, KeyError):
            continue
        if len(default) == len(train_t) and default != train_t:
            # no free choice: the engine's defaults are one fixed list
            add("ids_ignored", "ids_ignored", default, 0)
    # one mechanism for every slot: the residual dropped wherever there is one (the embedding
    # has none), or every capture skipped
    add("residual_missing", "residual_missing", tuple(mlp_label(b) if b > 0 else b for b in train_t), 1)
    add("stale_or_skipped (every slot zeros)", "stale_or_skipped", (ZERO,) * len(train_t), 1)
    if 0 in train_t and len(found) == len(train_t):
        # the embedding dropped from the list and the later slots moved up one, the engine's
        # own capture filling the last (vLLM reading [-1, 2, 30]: cat(3, 31, 59))
        rest = tuple(b for b in train_t if b != 0)
        add("embedding_missing", "embedding_missing", rest + tuple(found[len(rest):]), 1)
    for s, held in enumerate(found):
        if s >= len(train_t) or held in (None, AMBIGUOUS, train_t[s]):
            continue
        kind = _local_kind(train_t[s], held, n)
        pred = list(train_t)
        pred[s] = held
        add(_local_name(kind, train_t[s], held, n), kind, pred, 1)
    return sorted(out, key=lambda e: (e.error, e.free))


def _experiment(a: Explanation, b: Explanation, train: Sequence[int], n: int) -> str:
    """The run that tells two explanations apart, in words."""
    kinds = {a.kind, b.kind}
    if "offset" in kinds and len(train) < 2:
        return ("serve a draft whose ids name two or more boundaries, the embedding excluded "
                "(suites/test_layer_ids.py draws them): a shifted reading of the ids moves every "
                "slot, a fault at one boundary only its own")
    if "offset" in kinds:
        return ("serve the same boundaries one slot at a time, and a list without the endpoints: "
                "a shifted reading of the ids moves every slot the same way, a fault at one "
                "boundary only its own")
    if "slots_aliased" in kinds:
        return ("serve each boundary as a draft of one slot: slots sharing one buffer are right "
                "alone, a fault at one boundary repeats alone")
    if "ids_ignored" in kinds:
        return ("serve the same ids in the other config layout (top-level and nested): an engine "
                "that ignores the ids captures its defaults in both")
    return ("serve drafts whose ids name each boundary alone and in pairs (suites/test_layer_ids.py): "
            "the explanations predict different slots there")


def compare(winner_kind: str, winner_offset: int | None, errors: list[dict[Label, float]],
            found: Sequence[Label], train: Sequence[int], n: int, floor: float,
            engine_convention: str | None = None) -> Comparison | None:
    """The named label-read cause against every other candidate as simple as it; None where the
    winner is not among the candidates (a cause this module does not model keeps its own
    margin)."""
    ranked = explanations(errors, found, train, n, floor, engine_convention)
    mine = [e for e in ranked if e.kind == winner_kind
            and (winner_kind != "offset" or e.offset == winner_offset)]
    if not mine:
        return None
    win = mine[0]
    rivals = [e for e in ranked if e is not win and e.free <= win.free
              and not (e.kind == win.kind and e.offset == win.offset)]
    if not rivals:
        return Comparison(win, None, float("inf"), None, ranked)
    runner = min(rivals, key=lambda e: e.error)
    margin = runner.error / win.error if win.error > 0 else float("inf")
    return Comparison(win, runner, margin, _experiment(win, runner, train, n), ranked)


def rival_kind(diag: Any) -> str | None:
    """The kind of the runner-up an ambiguous diagnosis could not separate from its own (its
    `ambiguous_with` is a candidate's name, "offset +1"; the comparison maps names to kinds);
    None where the diagnosis is decided."""
    rival = diag.details.get("ambiguous_with")
    if rival is None:
        return None
    named = {c.get("name"): c.get("kind") for c in
             (diag.details.get("comparison") or {}).get("candidates", [])}
    return named.get(rival) or str(rival)


def settled(diagnoses: Sequence[Any]) -> list[Any]:
    """The diagnoses of one verdict built from several served lists, with every ambiguous one
    dropped where another list of the same run names one of its candidates decisively: the
    other list was the separating experiment (a draft of the embedding alone holding boundary 1
    fits a shift of every id and a dropped embedding alike; the same engine holding [1, 4] for
    [0, 4] tells them apart). An ambiguity nothing in the run settles stays, with its wording."""
    decisive = {d.kind for d in diagnoses if "ambiguous_with" not in d.details}
    return [d for d in diagnoses
            if "ambiguous_with" not in d.details or not ({d.kind, rival_kind(d)} & decisive)]
