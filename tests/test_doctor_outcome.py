"""The doctor's decision (harness.tools.doctor_outcome.decide) on every branch, from inference
records written out by hand: what the engine feeds against what the weights separate. The
property the doctor exists for: "wired as trained" only where the engine feeds the weights'
best boundaries AND the weights rule out every other candidate; a convention never enters."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from harness.tools.doctor_outcome import (
    CANNOT_TELL,
    EXIT_CODES,
    MISWIRED,
    WIRED,
    decide,
    scorable,
)

N = 8


def _inference(best: list[int], plausible: list[list[int]] | None = None, informative: bool = True,
               margin: float = 0.1, threshold: float = 0.02) -> SimpleNamespace:
    plausible = plausible or [best]
    return SimpleNamespace(boundaries=best, plausible=plausible, informative=informative,
                           accuracy=0.5, runner_up=plausible[1] if len(plausible) > 1 else [1, 2, 3],
                           runner_up_accuracy=0.4, margin=margin, threshold=threshold, prompts=24,
                           baseline_token=7, baseline_accuracy=0.1, baseline_threshold=0.02)


def test_exit_codes_are_distinct_for_the_three_outcomes() -> None:
    assert EXIT_CODES[WIRED] == 0 and EXIT_CODES[MISWIRED] == 1 and EXIT_CODES[CANNOT_TELL] == 4


def test_fed_the_decided_best_is_wired() -> None:
    out = decide(_inference([0, 4, 6]), [0, 4, 6], N, None, "more text")
    assert out.kind == WIRED and out.exit_code == 0 and out.trained == [0, 4, 6]


def test_fed_the_best_that_the_weights_do_not_separate_is_cannot_tell() -> None:
    """The correctly configured draft whose last slot the weights leave open: never "wired"."""
    inf = _inference([0, 4, 6], [[0, 4, 6], [0, 4, 7]], margin=0.01, threshold=0.02)
    out = decide(inf, [0, 4, 6], N, None, "more text")
    assert out.kind == CANNOT_TELL and out.exit_code == 4
    assert "[0, 4, 7]" in out.evidence and out.separate == "more text"
    assert out.shared_slots() == [0, 1]


def test_the_seed_case_is_miswired_even_where_the_best_is_not_unique() -> None:
    """Trained [0, 4, 6] (or [0, 4, 7]: not separated), fed [2, 4, 6], which the weights rule
    out: miswired, and the slots every candidate shares name the embedding."""
    inf = _inference([0, 4, 6], [[0, 4, 6], [0, 4, 7]], margin=0.01, threshold=0.02)
    out = decide(inf, [2, 4, 6], N, (0.16, 0.06), "more text")
    assert out.kind == MISWIRED and out.exit_code == 1 and out.trained == [0, 4, 6]
    assert out.shared_slots() == [0, 1] and "+0.160" in out.evidence


def test_fed_something_the_weights_do_not_rule_out_is_cannot_tell() -> None:
    inf = _inference([0, 4, 6], [[0, 4, 6], [0, 4, 7]], margin=0.01, threshold=0.02)
    out = decide(inf, [0, 4, 7], N, (0.01, 0.02), "more text")
    assert out.kind == CANNOT_TELL and "leads [0, 4, 7] by only" in out.evidence


def test_an_uninformative_draft_is_cannot_tell_whatever_is_fed() -> None:
    for fed in ([0, 4, 6], [2, 4, 6]):
        out = decide(_inference([0, 4, 6], informative=False), fed, N, (0.2, 0.01), "more text")
        assert out.kind == CANNOT_TELL and out.trained is None and "constant" not in out.kind
        assert "no better than always guessing" in out.evidence


def test_slots_no_training_feeds_are_miswired_without_the_weights() -> None:
    """A normed state, zeros, an unrecognised row, a missing or doubled slot: no EAGLE-3
    training feeds those, so the capture alone decides, even for an uninformative draft."""
    for fed in (["final_normed", 4, 6], ["zero", 4, 6], [None, 4, 6], [4, 6], [4, 4, 6], [0, 4, 9]):
        out = decide(_inference([0, 4, 6], informative=False), fed, N, None, "more text")
        assert out.kind == MISWIRED, fed
        assert not scorable(fed, 3, N)
    assert scorable([6, 0, 4], 3, N) and not scorable([True, 4, 6], 3, N)


def test_a_convention_cannot_enter_the_decision() -> None:
    """The signature itself: the config's ids read in a convention are not evidence (the
    motivating config was written wrong), so decide() never sees them."""
    assert "convention" not in inspect.signature(decide).parameters
