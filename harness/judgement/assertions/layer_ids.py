"""Pass/fail of the layer-id reading an engine declares and of the fixes the diagnosis suggests.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.diagnosis.record import Diagnosis, unexplained
from harness.reports.report import ConformanceFailure


def assert_convention_as_declared(declared: str, layout: str, observations: Sequence,
                                  diagnoses: Sequence[Diagnosis] = ()) -> None:
    """The engine read every id list served in `layout` the way the convention it declares (or,
    for an engine that honours training, the convention it was told) says. `observations`:
    harness.diagnosis.observed_convention.Observation; `diagnoses`: the capture diagnoses of the lists
    that differed from that prediction."""
    from harness.diagnosis.compare import settled
    from harness.diagnosis.observed_convention import disagreements, infer_layout

    wrong = disagreements(declared, observations)
    if wrong:
        seen = infer_layout(observations)
        text = (f"{layout} configs: the engine does not apply the layer-id rule {declared} states "
                f"on {len(wrong)} of {len(observations)} list(s): {'; '.join(wrong)}. Observed rule: "
                f"{seen['rule']}, slots in {seen['slot_order']}. ")
        # a list captured as trained explains nothing of the disagreement: it is dropped, and
        # where no other diagnosis is left the failure is unrecognised with its own evidence
        causes = settled([d for d in diagnoses if d.kind != "ok"]) or [unexplained(None, text)]
        raise ConformanceFailure(text + " ".join(d.message for d in causes)[:2000], causes)


def assert_fix_holds(result: str, holds: bool, diagnoses: Sequence[Diagnosis] = ()) -> None:
    """A suggested id list, re-served, made the engine capture the training boundaries (or a
    "no id list fixes this" claim survived the literal ids); `result` words it either way
    (harness.diagnosis.observed_convention.fix_result)."""
    if not holds:
        raise ConformanceFailure(result, list(diagnoses))

