"""A report's findings as a reader acts on them: the distinct causes (one per diagnosis kind,
its occurrences over drafts and checks folded in), who should act on each, and what the fix
result's wording means (verified, nothing to fix, not fixable by ids, failed).

report_html groups failed checks into root causes per draft; a wiring bug that shows in every
draft (12 checks, 4 drafts) is still one finding for the person who has to fix it, so the
page shows one card per finding and lists the drafts and checks it was seen in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# who acts on a diagnosis kind (harness.diagnosis.record.KINDS)
DEPLOYER = ("whoever deploys the draft: set the config's layer ids to the fix shown (or the "
            "engine vendor, to read the trainer's convention)")
ENGINE = "the engine vendor (or adapter author): the engine serves the draft unlike training"
TRAINER = "the draft's trainer: the draft's weights or config disagree with its training"
UNKNOWN = ("the engine vendor, with this report: no known cause matched the evidence "
           "(docs/DIAGNOSES.md)")
WHO_ACTS: dict[str, str] = {
    **dict.fromkeys(("offset", "embedding_missing", "order_permuted"), DEPLOYER),
    **dict.fromkeys(("unrecognised", "no diagnosis"), UNKNOWN),
    "draft_config": TRAINER,
}


def who_acts(kind: str) -> str:
    """Every kind not listed is the engine's to fix (capture internals, fc, vocab mapping,
    decode, crashes, hangs, NaN, throughput)."""
    return WHO_ACTS.get(kind, ENGINE)


def fix_class(result: str) -> str:
    """CSS class of a re-served fix's result text (harness.diagnosis.observed_convention.fix_result,
    harness.diagnosis.remedy): "ok" for verified or nothing to fix, "warn" where no id list can
    fix it or the remedy could not be re-served (the engine must change), "bad" where the
    suggested fix or the remedied copy failed."""
    text = result.strip().lower()
    if text.startswith(("fix verified", "no fix needed", "nothing to fix", "verified")):
        return "ok"
    if text.startswith("unverified: re-served"):  # the remedied copy still failed
        return "bad"
    if text.startswith(("no fix", "the diagnosis says no id list", "unverified")):
        return "warn"
    return "bad"


def fold(causes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Root causes (report_html.root_causes: one per draft and cause) folded into findings,
    one per (kind, expected or not): `occurrences` keeps each draft's cause in order, the
    first is the one a card shows in full."""
    out: dict[tuple[str, bool], dict[str, Any]] = {}
    for c in causes:
        expected = c["statuses"] <= {"xfail"}
        f = out.setdefault((c["kind"], expected), {"kind": c["kind"], "expected": expected,
                                                   "occurrences": [], "checks": [],
                                                   "drafts": [], "who": who_acts(c["kind"])})
        f["occurrences"].append(c)
        f["checks"] += c["checks"]
        if c["draft"] not in f["drafts"]:
            f["drafts"].append(c["draft"])
    # what the reader must act on first: unexpected before known (xfail), then most checks
    return sorted(out.values(), key=lambda f: (f["expected"], -len(f["checks"])))
