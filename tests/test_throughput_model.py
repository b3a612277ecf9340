"""The cost model and its gate (harness.core.throughput) on numbers whose answer is known by hand:
the arithmetic, both failure modes, the dominant cost, and the bad input it refuses."""

from __future__ import annotations

import pytest

from harness.core.throughput import (
    PAYS_AT,
    REALISED_SHARE,
    StepCosts,
    break_even_acceptance,
    dominant_cost,
    judge_speedup,
    predicted_speedup,
)


def costs(plain: float = 10e-3, verify: float = 12e-3, draft: float = 1e-3, feed: float = 2e-3,
          k: int = 4) -> StepCosts:
    return StepCosts(plain_step=plain, verify=verify, draft_step=draft, draft_feed=feed,
                     num_draft_tokens=k, prefix_tokens=8)


def test_round_and_prediction_by_hand() -> None:
    c = costs()
    assert c.round_cost == pytest.approx(12e-3 + 3 * 1e-3 + 2e-3)  # 17 ms
    assert predicted_speedup(c, 4.25) == pytest.approx(4.25 * 10 / 17)
    assert break_even_acceptance(c) == pytest.approx(1.7)
    assert predicted_speedup(c, 1.0) < 1  # nothing accepted: speculation only costs


def test_consistent_run_passes() -> None:
    c = costs()
    predicted = predicted_speedup(c, 4.0)
    finding = judge_speedup(c, 4.0, 0.8 * predicted, rounds_per_token=0.25)
    assert finding.failure is None and finding.predicted == pytest.approx(predicted)


def test_motivating_case_slower_than_plain_fails_with_both_numbers() -> None:
    """54.8 tok/s against 90 without speculation, where the acceptance promises a gain."""
    c = costs()
    finding = judge_speedup(c, 3.0, 54.8 / 90, rounds_per_token=1 / 3)
    assert finding.failure is not None
    assert "slower than plain decoding" in finding.failure
    assert "0.609x" in finding.failure and f"{finding.predicted:.3f}x" in finding.failure
    assert finding.dominant == "serving_loop"


def test_below_realised_share_fails_and_names_the_share() -> None:
    c = costs(k=8)  # round 21 ms; tau 8 predicts 3.81x, so the share is above 1x
    predicted = predicted_speedup(c, 8.0)
    measured = (REALISED_SHARE - 0.05) * predicted
    assert measured > 1
    finding = judge_speedup(c, 8.0, measured, rounds_per_token=1 / 8)
    assert finding.failure is not None and f"below the {REALISED_SHARE:.0%}" in finding.failure


def test_no_gain_promised_no_gain_demanded() -> None:
    """tau = 1.2 on these kernels predicts a loss: a slow run is then consistent, not a bug of
    the serving loop (the acceptance checks judge the wiring)."""
    c = costs()
    assert predicted_speedup(c, 1.2) < PAYS_AT
    finding = judge_speedup(c, 1.2, 0.6, rounds_per_token=1 / 1.2)
    assert finding.failure is None


def test_dominant_cost_counts_the_serving_loop() -> None:
    c = costs(verify=20e-3)
    assert dominant_cost(c, None)[0] == "verify"
    name, share = dominant_cost(c, measured_round=100e-3)
    assert name == "serving_loop" and share == pytest.approx(0.75)


@pytest.mark.parametrize("bad", [dict(plain=0.0), dict(verify=-1.0), dict(draft=float("nan")),
                                 dict(k=0)])
def test_bad_costs_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError, match="must be"):
        costs(**bad)


def test_acceptance_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="below 1"):
        predicted_speedup(costs(), 0.5)


def _shortfall_named() -> object:
    from harness.diagnosis.record import Diagnosis

    return Diagnosis(kind="offset", message="root cause: offset -1", engine_boundaries=[1],
                     training_boundaries=[2], suggested_layer_ids=None, offset=-1)


def test_slow_speculation_with_low_acceptance_is_named_by_the_acceptance_cause() -> None:
    """A wiring bug collapses acceptance and speculation stops paying: the gate's failure must
    carry the acceptance explainer's cause, not `speculation_overhead` (a confidently wrong
    name for the motivating user); with training's acceptance reached it is the overhead."""
    from harness.judgement.assertions import assert_speedup_consistent
    from harness.reports.report import ConformanceFailure

    finding = judge_speedup(costs(), 1.8, 0.9, rounds_per_token=1 / 1.8)
    assert finding.failure is not None
    args = dict(engine_name="e", draft="d", prompts=[[3]], check="c", dtype="float32",
                shortfall=_shortfall_named)
    with pytest.raises(ConformanceFailure) as low:
        assert_speedup_consistent(finding, trained_acceptance=4.2, **args)
    assert [d.kind for d in low.value.diagnoses] == ["offset"]
    assert "the acceptance, not the serving loop" in str(low.value)
    with pytest.raises(ConformanceFailure) as reached:
        assert_speedup_consistent(finding, trained_acceptance=1.9, **args)  # within 10%
    assert [d.kind for d in reached.value.diagnoses] == ["speculation_overhead"]
