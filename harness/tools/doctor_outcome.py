"""The doctor's three outcomes, decided from two pieces of evidence: what the engine fed the
draft (its capture, fingerprinted against the target's states) and what the draft's weights
say training fed it (harness.tools.weight_inference).

- "wired as trained": the engine feeds the weights' best boundaries and the weights separate
  them from every other candidate beyond the sampling error.
- "miswired": the engine feeds something the weights rule out (the best candidate beats it
  beyond the sampling error), or something no training feeds (a normed state, zeros, an
  unrecognised row, a wrong slot count). The trained boundaries named are the best
  candidate, with the candidates the weights do not separate from it.
- "cannot tell": anything else: the weights do not separate what the engine feeds from the
  best candidate, or the draft predicts the scored text no better than a constant guess.

A convention the user gives never enters here: it says what the config's ids would mean, and
the config is exactly what may have been written wrong (the motivating case), so it is printed
as an assumption beside the outcome, never as evidence for it.

Exit codes (the doctor's --help and docs/DOCTOR.md say the same): 0 wired as trained, 1 miswired
or the engine failed on the draft (crash or hang), 2 bad input or an engine not installed,
3 a bug of the suite, 4 cannot tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

WIRED, MISWIRED, CANNOT_TELL, ENGINE_FAILED = "wired as trained", "miswired", "cannot tell", "engine failed"
EXIT_CODES = {WIRED: 0, MISWIRED: 1, ENGINE_FAILED: 1, CANNOT_TELL: 4}
EXIT_HELP = ("exit codes: 0 wired as trained; 1 miswired, or the engine failed on the draft (crash, "
             "hang); 2 bad input or the engine is not installed; 3 a bug of the suite; 4 cannot "
             "tell (the weights do not separate what the engine feeds from what training used: "
             "the output names the candidates and what would separate them)")
SHOWN = 6  # plausible candidates listed in a line


@dataclass
class Outcome:
    kind: str
    trained: list[int] | None  # the weights' best candidate (None: they name none)
    plausible: list[list[int]]  # candidates not separated from it, itself first
    fed: list[Any] | None
    evidence: str  # the evidence and its strength, one sentence
    separate: str = ""  # cannot tell: what would separate the candidates
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    def shared_slots(self) -> list[int]:
        """Slots on which every plausible candidate agrees (the certain part of the answer)."""
        if not self.plausible:
            return []
        first = self.plausible[0]
        return [i for i in range(len(first))
                if all(len(c) == len(first) and c[i] == first[i] for c in self.plausible)]

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.kind, "trained": self.trained, "plausible": self.plausible,
                "fed": self.fed, "evidence": self.evidence, "separate": self.separate,
                "shared_slots": self.shared_slots(), **self.details}


def candidates_text(cands: Sequence[Sequence[int]]) -> str:
    shown = ", ".join(str(list(c)) for c in cands[:SHOWN])
    return shown + (f" and {len(cands) - SHOWN} more" if len(cands) > SHOWN else "")


def scorable(fed: Sequence[Any] | None, num_aux: int, num_layers: int) -> bool:
    """Whether the engine's slots are a boundary list the weights can be scored on: one
    boundary per slot, as many slots as fc was trained for, no boundary twice."""
    return (fed is not None and len(fed) == num_aux
            and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= num_layers for b in fed)
            and len(set(fed)) == len(fed))


def decide(inference: Any, fed: Sequence[Any], num_layers: int,
           versus: tuple[float, float] | None, more: str) -> Outcome:
    """The outcome (module doc). `inference`: a weight_inference.Inference; `fed`: the
    engine's slot labels; `versus`: (margin, threshold) of the best candidate against `fed`
    (weight_inference.compare), None where `fed` is not scorable or is the best; `more`: what
    would separate the candidates, for a "cannot tell"."""
    best, plausible = list(inference.boundaries), [list(c) for c in inference.plausible] or [list(inference.boundaries)]
    fed = list(fed)
    strength = (f"best {best} at block accuracy {inference.accuracy:.3f} vs runner-up "
                f"{inference.runner_up} {inference.runner_up_accuracy:.3f}: margin "
                f"{inference.margin:+.3f} against a threshold of {inference.threshold:.3f} over "
                f"{inference.prompts} prompts")
    if not scorable(fed, len(best), num_layers):
        return Outcome(MISWIRED, best, plausible, fed,
                       f"the engine's slots hold {fed}, which is not {len(best)} distinct "
                       f"boundaries of the target: no EAGLE-3 training feeds that; weights: {strength}")
    if not inference.informative:
        return Outcome(CANNOT_TELL, None, plausible, fed,
                       f"fed its best boundaries the draft predicts the scored text no better than "
                       f"always guessing token {inference.baseline_token} "
                       f"({inference.accuracy:.3f} vs {inference.baseline_accuracy:.3f}, needed a "
                       f"lead of {inference.baseline_threshold:.3f}), so the weights say nothing",
                       separate="check that the draft was trained for this target, then " + more)
    if fed == best and len(plausible) == 1:
        return Outcome(WIRED, best, plausible, fed,
                       f"the engine feeds the weights' best boundaries, and the weights rule out "
                       f"every other candidate: {strength}")
    if versus is not None and versus[0] > versus[1] and versus[0] > 0:
        return Outcome(MISWIRED, best, plausible, fed,
                       f"fed {fed} the draft predicts the target's tokens worse than fed {best} "
                       f"by {versus[0]:+.3f} (threshold {versus[1]:.3f} over {inference.prompts} "
                       f"prompts), so training did not feed it {fed}; {strength}",
                       details={"fed_margin": versus[0], "fed_threshold": versus[1]})
    gap = ("" if versus is None else
           f"; {best} leads {fed} by only {versus[0]:+.3f} (threshold {versus[1]:.3f})")
    return Outcome(CANNOT_TELL, best, plausible, fed,
                   f"the weights do not separate {candidates_text(plausible)} (the engine feeds "
                   f"{fed}){gap}; {strength}", separate=more,
                   details={} if versus is None else {"fed_margin": versus[0], "fed_threshold": versus[1]})
