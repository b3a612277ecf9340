"""The kinds seen in what the draft is fed while decoding: the positions of its feeds, the rows
re-fed after each verify round, and a dependence on earlier requests.

The evidence is the feeds themselves (`harness.engines.base.DecodeInputs`): row j of a prompt's
concatenated feeds stands for sequence position j (the prefill's rows, then each verify
round's accepted positions) and must be fed at position j with the target's features of j.
Each kind here is told apart from its neighbours by what the feeds show, not by elimination:

- `draft_kv_not_rolled_back`: rows right, positions after the prefill drift further from
  their rows round after round (the drafted steps' entries stayed in the cache, and the next
  feed starts after them);
- `draft_positions_shifted`: rows right, every position after the prefill off by the same
  constant (the decode path numbers the draft's positions differently from the prefill);
- `decode_misaligned`: positions right, prefill rows right, the re-fed rows are the target's
  features of other positions: all of them the row before (one late) or after (one early), or
  some rows of each round (a stale bonus row, a round's rows reversed) with every other re-fed
  row in place;
- `draft_positions_shifted` also where the feeds after the prefill restart at position 0 each
  round, or are counted back from the verify window's end (off by the number rejected);
- `history_dependent`: a prompt's feeds, captures or acceptance depend on the requests served
  before it (the prefill of a fresh request fed at a position other than 0, varying from
  request to request, is the draft cache of the previous request kept);
- `fc_on_recurrent_state` never shows here: the feeds are right and only the draft steps after
  the first are wrong, which is why a passing decode-input check rules out the kinds above.

It names causes and decides nothing: `harness.judgement.assertions` judges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.diagnosis.draft_side import fc_diagnosis
from harness.diagnosis.fingerprint import relative_errors
from harness.diagnosis.record import Diagnosis

# A re-fed row is identified as the features of position j + s when its error to those is at
# least this many times smaller than to the two other candidate rows (j, j - 1, j + 1): the
# separation harness.core.tolerances gives reduced precision (REASONS['separation']: a state within
# a third of the distance to its neighbour is twice as near it as to the neighbour).
ROW_SEPARATION = 2.0
# Share of re-fed rows that must be identified with one shift for the shift to be named: a
# misalignment is systematic (every re-feed), a few identified rows are chance (two adjacent
# tokens' states can be close where the tokens repeat).
ROW_SHARE = 0.8


@dataclass(frozen=True)
class FeedOffsets:
    """One prompt's feeds as offsets from contiguous numbering: feed r's first position minus
    the index of its first row; `ragged` names feeds whose positions are not consecutive."""

    offsets: list[int]
    ragged: list[int]
    rows: list[int]  # rows per feed
    # per feed with drafted steps: their first position minus (the feed's last position + 1),
    # then whether they run consecutively
    steps: list[int]
    ragged_steps: list[int]
    # per feed, how many drafted steps followed it (what a draft cache not rolled back keeps)
    step_counts: list[int] = field(default_factory=list)

    @property
    def prefill(self) -> int:
        return self.offsets[0] if self.offsets else 0

    @property
    def after_prefill(self) -> list[int]:
        """Offsets of the re-feeds relative to the prefill's."""
        return [o - self.prefill for o in self.offsets[1:]]


def _consecutive(pos: Sequence[int]) -> bool:
    return list(pos) == list(range(pos[0], pos[0] + len(pos))) if pos else True


def feed_offsets(positions: Sequence[Sequence[int]],
                 step_positions: Sequence[Sequence[int]] = ()) -> FeedOffsets:
    """positions: per feed, the positions it was fed at; step_positions: per feed, the
    positions of the drafted steps that followed it (training: right after the feed's last)."""
    offsets, ragged, rows, steps, ragged_steps, counts = [], [], [], [], [], []
    start = 0
    for r, pos in enumerate(positions):
        pos = [int(p) for p in pos]
        offsets.append(pos[0] - start if pos else 0)
        if not _consecutive(pos):
            ragged.append(r)
        after = [int(p) for p in step_positions[r]] if r < len(step_positions) else []
        if pos and after:
            steps.append(after[0] - (pos[-1] + 1))
            if not _consecutive(after):
                ragged_steps.append(r)
        rows.append(len(pos))
        counts.append(len(after))
        start += len(pos)
    return FeedOffsets(offsets, ragged, rows, steps, ragged_steps, counts)


# What each candidate cause predicts for one prompt's feeds, from the prompt's own rows and
# drafted-step counts and the cause's one fitted number: per feed, its offset from contiguous
# numbering, and per feed with drafted steps, their offset from right after the feed.
_PATTERNS: tuple[tuple[str, str | None], ...] = (
    ("as_trained", None),
    ("steps_shifted", "draft_positions_shifted"),
    ("all_shifted", "draft_positions_shifted"),
    ("decode_shifted", "draft_positions_shifted"),
    ("reset_per_round", "draft_positions_shifted"),
    ("from_window_end", "draft_positions_shifted"),
    ("cache_kept", "draft_kv_not_rolled_back"),
)


@dataclass(frozen=True)
class PositionCause:
    """One candidate explanation of the feeds' positions, scored on every prompt's feeds:
    `misses` counts the feeds and drafted-step runs (of `units`) whose positions it does not
    predict exactly. Positions are integers, so one mispredicted feed refutes a cause: the
    margin of a cause that fits every feed over a rival is the number of feeds refuting the
    rival (0: the evidence does not separate them)."""

    pattern: str
    kind: str | None  # None: as trained
    param: int | None
    misses: int
    units: int

    @property
    def name(self) -> str:
        what = {"as_trained": "as trained",
                "steps_shifted": f"drafted steps {self.param:+d}" if self.param is not None else "",
                "all_shifted": f"every row {self.param:+d}" if self.param is not None else "",
                "decode_shifted": f"every re-feed {self.param:+d}" if self.param is not None else "",
                "reset_per_round": "re-feeds numbered from 0",
                "from_window_end": f"re-feeds counted back from a window of {self.param}",
                "cache_kept": "drafted entries kept in the draft cache"
                + (f" (less {self.param} per round)" if self.param else "")}[self.pattern]
        return what if self.kind is None else f"{self.kind} ({what})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "pattern": self.pattern, "param": self.param,
                "misses": self.misses, "units": self.units}


def _predict(pattern: str, param: int | None, f: FeedOffsets) -> tuple[list[int], list[int]]:
    """(offset per feed, offset per drafted-step run) that `pattern` predicts for `f`."""
    n, c = len(f.offsets), param or 0
    steps = [c if pattern == "steps_shifted" else 0] * len(f.steps)
    if pattern == "all_shifted":
        return [c] * n, steps
    if pattern == "decode_shifted":
        return [0] + [c] * (n - 1), steps
    if pattern == "reset_per_round":
        return [0] + [-sum(f.rows[:r]) for r in range(1, n)], steps
    if pattern == "from_window_end":
        return [0] + [c - f.rows[r] for r in range(1, n)], steps
    if pattern == "cache_kept":
        out = [0]
        for r in range(1, n):
            kept = f.step_counts[r - 1] if r - 1 < len(f.step_counts) else 0
            out.append(out[-1] + max(kept - c, 0))
        return out, steps
    return [0] * n, steps


def _mode(values: Sequence[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None


def _fit(pattern: str, found: Sequence[FeedOffsets]) -> int | None:
    """The one number `pattern` is free to choose, fitted as the commonest value the feeds
    that are off imply (None where no feed implies one: the pattern then predicts training)."""
    if pattern == "steps_shifted":
        return _mode([s for f in found for s in f.steps if s])
    if pattern == "all_shifted":
        return _mode([f.prefill for f in found if f.prefill])
    if pattern == "decode_shifted":
        return _mode([o for f in found for o in f.offsets[1:] if o])
    if pattern == "from_window_end":
        return _mode([o + n for f in found for o, n in zip(f.offsets[1:], f.rows[1:], strict=True) if o])
    if pattern == "cache_kept":
        return _mode([f.step_counts[r - 1] - (f.offsets[r] - f.offsets[r - 1])
                      for f in found for r in range(1, len(f.offsets))
                      if r - 1 < len(f.step_counts) and f.offsets[r] > f.offsets[r - 1]]) or 0
    return None


def position_causes(found: Sequence[FeedOffsets]) -> list[PositionCause]:
    """Every candidate cause scored on every prompt's feeds, fewest misses first (ties in
    _PATTERNS' order). A feed whose positions are not consecutive, or a drafted-step run that
    is not, is a miss for every cause: none predicts gaps inside a feed."""
    causes = []
    for pattern, kind in _PATTERNS:
        param = _fit(pattern, found)
        if kind is not None and pattern not in ("reset_per_round", "cache_kept") and param is None:
            continue  # nothing off where this pattern would have it: it is training
        misses = units = 0
        for f in found:
            offsets, steps = _predict(pattern, param, f)
            misses += sum(a != b for a, b in zip(offsets, f.offsets, strict=True))
            misses += sum(a != b for a, b in zip(steps, f.steps, strict=True))
            misses += len(f.ragged) + len(f.ragged_steps)
            units += len(f.offsets) + len(f.steps)
        causes.append(PositionCause(pattern, kind, param, misses, units))
    order = {p: i for i, (p, _) in enumerate(_PATTERNS)}
    return sorted(causes, key=lambda c: (c.misses, order[c.pattern]))


# The experiment that separates two causes fitting the same feeds, by what tells them apart.
_SEPARATE = {
    frozenset({"decode_shifted", "cache_kept"}): (
        "serve longer generations, so that each prompt has two or more verify rounds after the "
        "prefill: a constant offset stays, a draft cache not rolled back drifts further each round"),
    frozenset({"decode_shifted", "from_window_end"}): (
        "serve prompts whose verify rounds accept different numbers of tokens: a count back from "
        "the window's end moves with the rows re-fed, a constant offset does not"),
    frozenset({"from_window_end", "cache_kept"}): (
        "serve prompts whose verify rounds accept every drafted token: a count back from the "
        "window's end is then right, a draft cache not rolled back still drifts"),
}


def _sentence(pattern: str, param: int | None, found: Sequence[FeedOffsets]) -> str:
    """What the feeds show under the winning pattern, in the engine's terms."""
    refeeds = [(o, n) for f in found for o, n in zip(f.offsets[1:], f.rows[1:], strict=True)]
    if pattern == "steps_shifted":
        return (f"every feed is at its sequence positions, but the drafted steps after each feed "
                f"run {param:+d} from where they belong (training: the first drafted step right "
                f"after the feed's last position, then one further per step)")
    if pattern == "all_shifted":
        return (f"every row the draft was fed, prefill included, sits {param:+d} positions from "
                f"its place in the sequence (training: row t at position t)")
    if pattern == "decode_shifted":
        return (f"the prefill was fed at positions 0..T-1 as trained, but every feed after a "
                f"verify round (and the drafted steps after it) sits {param:+d} from its place: "
                f"the decode path numbers the draft's positions differently from the prefill")
    if pattern == "reset_per_round":
        return ("the prefill was fed at positions 0..T-1 as trained, but every feed after a verify "
                "round starts again at position 0 (and its drafted steps after it): the decode path "
                "numbers the re-fed rows by their index in the round, not their sequence position")
    if pattern == "from_window_end":
        return (f"every feed after a verify round is off by {param} minus the rows it re-feeds "
                f"(offsets {[o for o, _ in refeeds[:8]]} for {[n for _, n in refeeds[:8]]} rows): "
                f"0 where the round accepted every drafted token, the number rejected otherwise. "
                f"The re-fed positions are counted back from the end of the verify window "
                f"({param} positions) instead of forward from the accepted prefix")
    growing = [f.after_prefill for f in found if len(f.after_prefill) > 1] or [
        f.after_prefill for f in found if f.after_prefill]
    return (f"the rows fed after each verify round are right, but their positions drift further "
            f"from the accepted prefix round after round (about {_drift_per_round(growing):.1f} "
            f"positions per round, e.g. offsets {growing[0][:6]}): the draft cache kept the drafted "
            f"steps' entries and each feed continues after them")


def _drift_per_round(growing: Sequence[Sequence[int]]) -> float:
    """The mean drift per verify round of the re-feed offsets after the prefill (a prompt with
    one re-feed drifted by its offset in its one round)."""
    return sum((g[-1] - g[0]) / (len(g) - 1) if len(g) > 1 else g[0] for g in growing) / len(growing)


def diagnose_positions(found: Sequence[FeedOffsets]) -> Diagnosis | None:
    """The cause of feeds at positions other than their rows' (None: every feed in place).
    `found`: per prompt, in the order the prompts were served.

    A model comparison (issue #31): every candidate cause predicts every feed's position and is
    scored by the feeds it mispredicts (`position_causes`); a cause is named only where it
    predicts every feed, its margin is the feeds refuting the best rival of another kind, and
    where a rival fits every feed too the diagnosis says "ambiguous" and names the experiment
    that separates them (e.g. a constant re-feed offset and a cache not rolled back agree while
    each prompt has only one verify round after its prefill)."""
    if all(not any(f.offsets) and not f.ragged and not any(f.steps) and not f.ragged_steps
           for f in found):
        return None
    prefill = [f.prefill for f in found]
    evidence: dict[str, Any] = {"prefill_offsets": prefill,
                                "offsets_after_prefill": [f.after_prefill[:12] for f in found]}
    if any(prefill) and len(set(prefill)) > 1:
        before = [None] + [sum(f.rows) for f in found[:-1]]
        kept = sum(1 for p, b in zip(prefill, before, strict=True) if b is not None and p >= b)
        return decode_diagnosis(
            "history_dependent",
            f"each prompt's prefill was fed to the draft at a different first position "
            f"({prefill[:8]} for prompts served in order; training: 0 for every request); on "
            f"{kept}/{len(found) - 1} prompts it starts at or after the end of the previous "
            f"request's feeds: the draft cache of an earlier request was not cleared; no cause "
            f"within one request predicts {len(set(prefill))} different first positions",
            confidence_margin=float(len(set(prefill)) - 1), **evidence)
    evidence["drafted_step_offsets"] = sorted({s for f in found for s in f.steps})
    causes = position_causes(found)
    evidence["causes"] = [c.to_json() for c in causes[:6]]
    fits = [c for c in causes if c.misses == 0 and c.kind is not None]
    if not fits:
        nearest = next(c for c in causes if c.kind is not None) if any(c.kind for c in causes) else causes[0]
        ragged = [(i, f.ragged[:3]) for i, f in enumerate(found) if f.ragged]
        return Diagnosis(
            kind="unrecognised",
            message=("the draft's feeds are at positions no known cause explains: per prompt, the "
                     f"offset of each feed from its rows' positions {[f.offsets[:8] for f in found[:3]]}"
                     + (f", non-consecutive positions inside feeds {ragged[:3]}" if ragged else "")
                     + f"; the nearest cause, {nearest.name}, mispredicts {nearest.misses} of "
                     f"{nearest.units} feeds and drafted-step runs (read the per-feed offsets in details)"),
            engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
            details={**evidence, "confidence_margin": 0.0, "addressee": "engine vendor"})
    winner = fits[0]
    rivals = [c for c in causes if c.kind is not None and c.kind != winner.kind]
    runner_up = rivals[0] if rivals else None
    same_kind = [c.name for c in fits[1:] if c.kind == winner.kind]
    margin = float(runner_up.misses) if runner_up is not None else float(winner.units)
    ambiguous = runner_up is not None and runner_up.misses == 0
    experiment = (_SEPARATE.get(frozenset({winner.pattern, runner_up.pattern}),
                                "serve more prompts with more verify rounds")
                  if ambiguous and runner_up is not None else None)
    detail = _sentence(winner.pattern, winner.param, found)
    if runner_up is None:
        detail += "; no cause of another kind is a candidate"
    elif ambiguous:
        detail += (f". Ambiguous between {winner.name} and {runner_up.name}: both predict every one "
                   f"of the {winner.units} feeds and drafted-step runs; the experiment that "
                   f"separates them: {experiment}")
    else:
        detail += (f". Confidence margin: {runner_up.misses} of {winner.units} feeds and drafted-step "
                   f"runs refute the runner-up, {runner_up.name}; this cause predicts all of them")
    if same_kind:
        detail += f" (the feeds fit {', '.join(same_kind)} as well: the same cause and fix)"
    comparison = {"winner": winner.name, "runner_up": runner_up.name if runner_up else None,
                  "margin": margin, "ambiguous": ambiguous, "experiment": experiment,
                  "candidates": evidence["causes"]}
    extra: dict[str, Any] = {"confidence_margin": margin, "comparison": comparison, **evidence}
    if ambiguous and runner_up is not None:
        extra["ambiguous_with"] = runner_up.name
    if winner.kind == "draft_kv_not_rolled_back":
        growing = [f.after_prefill for f in found if len(f.after_prefill) > 1]
        diag = fc_diagnosis("draft_kv_not_rolled_back", detail,
                            per_round=round(_drift_per_round(growing), 3) if growing else None, **extra)
    else:
        offset = winner.param if winner.pattern not in ("reset_per_round", "from_window_end") else None
        pattern = {"reset_per_round": {"pattern": "reset_per_round"},
                   "from_window_end": {"pattern": "from_window_end", "window": winner.param}}.get(winner.pattern, {})
        diag = decode_diagnosis("draft_positions_shifted", detail, offset=offset, **pattern, **extra)
    if ambiguous and runner_up is not None:
        diag.message = diag.message.replace(
            "root cause:", f"likeliest cause, not separated from {runner_up.name}:", 1)
    return diag


@dataclass(frozen=True)
class RowShift:
    """Which positions' features the rows re-fed after verify rounds hold: per shift s, how
    many re-fed rows are identified as the features of position j + s alone (any s: a row is
    compared with every row of its prompt), how many are consistent with s (s is among the
    positions the row is near: identified as j + s, or near j + s and another position alike),
    and the prefill's rows consistent with their own position.

    Rows near several positions carry no evidence between them: where a continuation repeats a
    token, the target's states at the repeats differ by less than reduced precision's noise
    (bf16: the re-fed rows of zoo:decode_rows_one_late were 24% such rows on the pinned
    prompts), so a shift is named from the rows that separate the candidates, and is not refuted
    by the rows that cannot."""

    identified: dict[int, int]
    rows: int
    prefill_rows: int
    prefill_in_place: int
    consistent: dict[int, int] = field(default_factory=dict)
    ambiguous: int = 0

    @property
    def clear(self) -> int:
        """Re-fed rows identified as one position's features."""
        return sum(self.identified.values())

    def _ranked(self) -> list[tuple[int, int]]:
        """(shift, rows consistent with it), most consistent first (a tie: the smaller shift)."""
        return sorted(self.consistent.items(), key=lambda kv: (-kv[1], abs(kv[0]), kv[0]))

    @property
    def systematic(self) -> int | None:
        """The shift the re-fed rows hold, if systematic and not 0: of every shift, the one the
        most re-fed rows are consistent with, ROW_SHARE of them, while the rows being in place
        is refuted by more than the rest (a continuation that repeats with period p leaves the
        shifts p apart consistent with most rows too: `runner_up` and `margin` say how far the
        rows separate them)."""
        if not self.rows or not self.consistent:
            return None
        shift, count = self._ranked()[0]
        if shift == 0 or count < ROW_SHARE * self.rows:
            return None
        if self.consistent.get(0, 0) >= ROW_SHARE * self.rows or self.identified.get(shift, 0) < 1:
            return None
        return shift

    @property
    def runner_up(self) -> tuple[int, int]:
        """(shift, rows consistent with it) of the best explanation other than the named one
        (the rows in place among them)."""
        named = self.named
        return next(((s, c) for s, c in self._ranked() if s != named), (0, 0))

    @property
    def margin(self) -> int:
        """Rows consistent with the named shift that refute its runner-up: the evidence for the
        shift over the next-best explanation (0 where nothing is named)."""
        named = self.named
        if named is None:
            return 0
        if self.systematic is None:  # a partial misalignment: the rows it misplaces
            return self.misplaced
        return self.consistent.get(named, 0) - self.runner_up[1]

    @property
    def misplaced(self) -> int:
        """Re-fed rows identified as another position's features."""
        return sum(c for s, c in self.identified.items() if s)

    @property
    def named(self) -> int | None:
        """A misalignment to name: the systematic shift, or else the commonest shift where
        re-fed rows are misplaced only in part (some rows of each round: the bonus row left
        stale, a round's rows reversed) but every re-fed row is near a position, in place or
        another position's features: nothing else in the feed is off."""
        if self.systematic is not None:
            return self.systematic
        if (self.misplaced >= max(PARTIAL_MIN, PARTIAL_SHARE * self.rows)
                and self.clear + self.ambiguous >= ROW_SHARE * self.rows):
            return max(((s, c) for s, c in self.identified.items() if s), key=lambda kv: kv[1])[0]
        return None


# A row is identified only where it IS that position's features (relative error at most this),
# not merely nearer it than to the others: a capture of other boundaries is near no row.
ROW_MATCH = 0.1
# A partial misalignment: at least this many re-fed rows, and this share of them, identified as
# other positions' features (a chance near-duplicate of a repeated token is one or two rows).
PARTIAL_MIN = 3
PARTIAL_SHARE = 0.05


def row_shift(rows: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
              prefill_rows: Sequence[int]) -> RowShift:
    """rows[i]: prompt i's fed rows [M, F] (row j for position j); expected[i]: training's fc
    input at positions 0..M-1 [M, F]; prefill_rows[i]: how many of the rows the prefill fed.

    A row whose smallest error is within ROW_MATCH is near the positions whose error is less
    than ROW_SEPARATION times that smallest: one such position identifies it; several leave it ambiguous among them (each
    counted as consistent); none (a capture of other boundaries) refutes every shift."""
    identified: dict[int, int] = {-1: 0, 0: 0, 1: 0}
    consistent: dict[int, int] = {-1: 0, 0: 0, 1: 0}
    total = prefill_total = prefill_ok = ambiguous = 0
    for x, ref, n in zip(rows, expected, prefill_rows, strict=True):
        m = x.shape[0]
        if not m:
            continue
        errors = relative_errors(x[:, None], ref[None, :m])  # [M, M]: row j against position c
        for j in range(m):
            err = errors[j]
            best = float(err.min())
            near = (err < ROW_SEPARATION * best).nonzero().flatten().tolist() if best <= ROW_MATCH else []
            if best == 0.0:  # bitwise equal: only the positions that equal it too
                near = (err == 0.0).nonzero().flatten().tolist()
            if j < n:
                prefill_total += 1
                prefill_ok += int(j in near)
                continue
            total += 1
            for c in near:
                consistent[c - j] = consistent.get(c - j, 0) + 1
            if len(near) == 1:
                identified[near[0] - j] = identified.get(near[0] - j, 0) + 1
            elif near:
                ambiguous += 1
    return RowShift(identified, total, prefill_total, prefill_ok, consistent, ambiguous)


def misaligned_diagnosis(shift: RowShift) -> Diagnosis:
    prefill = (f"the prefill fed the draft the training features ({shift.prefill_in_place}/"
               f"{shift.prefill_rows} rows at their own position), but after each verify round ")
    shifts = {str(k): v for k, v in sorted(shift.identified.items()) if v}
    if shift.systematic is not None:
        side = "late" if shift.named == -1 else "early" if shift.named == 1 else f"{shift.named:+d} off"
        detail = (f"the re-fed rows are one row {side}: {shift.identified[shift.named]}/{shift.rows} of "
                  f"them are the target's features of position t{shift.named:+d} fed at position t"
                  f"{_margin(shift)}")
    else:
        later = sum(c for s, c in shift.identified.items() if s > 0)
        earlier = sum(c for s, c in shift.identified.items() if s < 0)
        # as many rows hold a later position's features as an earlier one's: rows swapped
        pairs = later > 0 and abs(later - earlier) <= 0.1 * (later + earlier)
        detail = (f"{shift.misplaced}/{shift.rows} of the re-fed rows are the target's features of "
                  f"another position (rows by offset from their own position: {shifts}), the "
                  f"other {shift.identified.get(0, 0)} in place"
                  + ("; as many rows hold a later position's features as an earlier one's: rows of a "
                     "round swapped among themselves, e.g. the accepted path gathered leaf to root" if pairs else
                     "; the misplaced rows hold earlier positions' features only: some rows of a "
                     "round left stale, e.g. the bonus token's row by a copy of the accepted rows "
                     "alone"))
    return decode_diagnosis(
        "decode_misaligned",
        prefill + detail + " (positions themselves in place, so the draft cache is rolled back)",
        shift=shift.named, systematic=shift.systematic is not None, identified=shifts,
        rows=shift.rows, ambiguous=shift.ambiguous, **_comparison(shift))


def _comparison(shift: RowShift) -> dict[str, Any]:
    """The model comparison's fields every diagnosis carries (confidence_margin, comparison,
    ambiguous_with where the runner-up is not separated), in rows: what the scan and the
    report read."""
    other = shift.runner_up[0]
    runner = "rows in place" if other == 0 else f"rows t{other:+d}"
    out: dict[str, Any] = {"confidence_margin": float(shift.margin),
                           "comparison": {"winner": f"rows t{shift.named:+d}", "runner_up": runner,
                                          "unit": "re-fed rows"}}
    if shift.margin < PARTIAL_MIN:
        out["ambiguous_with"] = runner
    return out


def _margin(shift: RowShift) -> str:
    """The shift's margin over its runner-up, the rows in place, and the rows near several
    positions alike, in words; where the margin is under PARTIAL_MIN rows, the shift is
    ambiguous with the runner-up and the sentence names what would separate them."""
    other, fits = shift.runner_up
    runner = "the rows being in place" if other == 0 else f"position t{other:+d}"
    text = (f"; {shift.consistent.get(shift.named, 0)}/{shift.rows} re-fed rows fit t{shift.named:+d}, "
            f"{shift.consistent.get(0, 0)} fit their own position; margin over the runner-up "
            f"({runner}): {shift.margin} row(s)")
    if shift.ambiguous:
        text += (f"; {shift.ambiguous} row(s) are near several positions alike (the target's "
                 "states there lie within the dtype's noise of each other, e.g. a repeated token)")
    if shift.margin < PARTIAL_MIN:
        text += (f"; ambiguous between t{shift.named:+d} and {runner}: the continuation repeats, so "
                 "few rows separate them; a prompt whose continuation does not repeat (or fp32) would")
    return text


_TEXT = {
    "decode_misaligned": (
        "decode-time features misaligned — after a verify round the engine re-feeds the accepted "
        "positions with the verify forward's features of other rows (one row off: an index into "
        "the verify output counted from the previous round's last position; or some rows of each "
        "round: the bonus token's row left stale, the accepted path's rows out of order). The prefill is right, so the capture checks pass and acceptance falls after the "
        "first round. Fix in the engine: re-feed position t with the target's features at t."),
    "draft_positions_shifted": (
        "draft positions shifted — the draft's rotary positions (and causal mask) on its decode "
        "path are off from training, where row t runs at position t; under RoPE only the shift "
        "between the prefill's entries and later ones matters, so acceptance drops a little and "
        "the tokens stay right. Fix in the engine: number the draft's rows with the target's "
        "position ids on every path."),
    "history_dependent": (
        "request history dependent — what one request is served depends on the requests served "
        "before it: state kept between requests (a draft KV cache or aux-state buffer reused "
        "without clearing, positions continuing from an earlier request). Fix in the engine: "
        "reset per-request draft state (cache slots, aux buffers, positions) when a request "
        "starts."),
}


def decode_diagnosis(kind: str, detail: str, **details: Any) -> Diagnosis:
    """A Diagnosis for a bug seen in the draft's decode-time feeds or in request history."""
    if kind not in _TEXT:
        raise ValueError(f"unknown decode-time kind {kind!r}; use one of {sorted(_TEXT)}")
    return Diagnosis(kind=kind, message=f"{detail.rstrip('.')}; root cause: {_TEXT[kind]}",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
                     details=details)

