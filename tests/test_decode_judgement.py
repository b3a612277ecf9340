"""The decode-input and request-history judgements on real target features: a correct set of
feeds passes, and each way of feeding the draft wrongly while decoding (rows one late, drafted
steps one position too far, a cache not rolled back, a cache kept from the previous request,
another history) fails with its own diagnosis and a message that says what was seen."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from harness.engines.base import DecodeInputs, DraftFeed
from harness.golden.features import TargetFeatures, aux_features, target_features
from harness.judgement.assertions import (
    CaptureContext,
    assert_decode_inputs_match,
    assert_history_independent,
)
from harness.models.target import build_target, target_config_dict
from harness.reports.report import ConformanceFailure

N = 8
BOUNDARIES = [2, 4, 5]
K = 4
PROMPTS = [[5, 9, 17, 33, 2, 71, 8], [3, 100, 7, 6, 40]]
TOKENS = [[11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
ROUNDS = [3, 1, 4, 2]  # rows re-fed per verify round (accepted + 1)


class _Oracle:
    """The part of harness.golden.oracle.Oracle the judgements read, on a seeded tiny target."""

    def __init__(self) -> None:
        self.model = build_target(target_config_dict(num_layers=N), seed=0)

    @cache  # noqa: B019 - one oracle per module
    def features(self, seq: tuple[int, ...]) -> TargetFeatures:
        return target_features(self.model, list(seq))


@pytest.fixture(scope="module")
def oracle() -> _Oracle:
    o = _Oracle()
    features = o.features
    o.features = lambda seq: features(tuple(seq))  # type: ignore[method-assign]
    return o


def _feeds(oracle, prompt, tokens, *, late=False, step_shift=0, drift=0, start=0) -> list[DraftFeed]:
    """Training's feeds of prompt + tokens, optionally with one bug."""
    rows = aux_features(oracle.features(list(prompt) + list(tokens)), BOUNDARIES)
    sizes = [len(prompt)] + ROUNDS
    feeds, row = [], 0
    for r, n in enumerate(sizes):
        x = rows[row:row + n]
        if late and r > 0:
            x = rows[row - 1:row + n - 1]
        first = row + start + drift * r
        positions = list(range(first, first + n))
        steps = list(range(positions[-1] + 1 + step_shift, positions[-1] + K + step_shift))
        feeds.append(DraftFeed(positions, x.clone(), steps))
        row += n
    return feeds


def _judge(oracle, decode: DecodeInputs) -> None:
    ctx = CaptureContext(training_boundaries=BOUNDARIES, config_ids=[1, 3, 4], dtype="float32",
                         engine_name="test", draft="d", check="test")
    assert_decode_inputs_match(ctx, decode=decode, oracle=oracle, prompts=PROMPTS)


def _fails(oracle, decode: DecodeInputs) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as info:
        _judge(oracle, decode)
    return info.value


def test_training_feeds_pass(oracle) -> None:
    _judge(oracle, DecodeInputs(TOKENS, [_feeds(oracle, p, t) for p, t in zip(PROMPTS, TOKENS, strict=True)]))


def test_rows_one_late_are_decode_misaligned(oracle) -> None:
    failed = _fails(oracle, DecodeInputs(TOKENS, [_feeds(oracle, p, t, late=True)
                                                  for p, t in zip(PROMPTS, TOKENS, strict=True)]))
    assert [d.kind for d in failed.diagnoses] == ["decode_misaligned"]
    assert "one row late" in str(failed) and "prefill" in str(failed)


def test_drafted_steps_one_too_far_are_draft_positions_shifted(oracle) -> None:
    failed = _fails(oracle, DecodeInputs(TOKENS, [_feeds(oracle, p, t, step_shift=1)
                                                  for p, t in zip(PROMPTS, TOKENS, strict=True)]))
    assert [d.kind for d in failed.diagnoses] == ["draft_positions_shifted"]
    assert failed.diagnoses[0].details["offset"] == 1 and "drafted steps" in str(failed)


def test_positions_drifting_each_round_are_draft_kv_not_rolled_back(oracle) -> None:
    failed = _fails(oracle, DecodeInputs(TOKENS, [_feeds(oracle, p, t, drift=K - 1)
                                                  for p, t in zip(PROMPTS, TOKENS, strict=True)]))
    assert [d.kind for d in failed.diagnoses] == ["draft_kv_not_rolled_back"]
    assert "drift" in str(failed)


def test_prefill_after_the_previous_request_is_history_dependent(oracle) -> None:
    first = _feeds(oracle, PROMPTS[0], TOKENS[0])
    kept = first[-1].positions[-1] + 1
    second = _feeds(oracle, PROMPTS[1], TOKENS[1], start=kept)
    failed = _fails(oracle, DecodeInputs(TOKENS, [first, second]))
    assert [d.kind for d in failed.diagnoses] == ["history_dependent"]
    assert f"[0, {kept}]" in str(failed) and "not cleared" in str(failed)


def test_wrong_boundaries_at_decode_time_get_the_capture_diagnosis(oracle) -> None:
    """A decode-time feed of other boundaries (vLLM's one boundary early) is the capture's
    cause, named the capture check's way."""
    decode = []
    for p, t in zip(PROMPTS, TOKENS, strict=True):
        rows = aux_features(oracle.features(list(p) + list(t)), [b - 1 for b in BOUNDARIES])
        feeds = _feeds(oracle, p, t)
        start = 0
        for f in feeds:
            f.features = rows[start:start + len(f.positions)].clone()
            start += len(f.positions)
        decode.append(feeds)
    failed = _fails(oracle, DecodeInputs(TOKENS, decode))
    assert [d.kind for d in failed.diagnoses] == ["offset"] and "decode-time feeds" in str(failed)


def _history(oracle, traces) -> None:
    features = [aux_features(oracle.features(p), BOUNDARIES) for p in PROMPTS]
    assert_history_independent(prompts=PROMPTS, history="in reverse order", features=(features, features),
                               tokens=(TOKENS, TOKENS), traces=traces, oracle=oracle, dtype="float32",
                               device="cpu", engine_name="test", draft="d", check="test")


def test_same_servings_are_history_independent(oracle) -> None:
    _history(oracle, ([[1, 2, 0]] * 2, [[1, 2, 0]] * 2))


def test_another_trace_after_other_requests_is_history_dependent(oracle) -> None:
    with pytest.raises(ConformanceFailure) as info:
        _history(oracle, ([[1, 2, 0], [4, 4]], [[1, 2, 0], [0, 1, 1]]))
    assert [d.kind for d in info.value.diagnoses] == ["history_dependent"]
    assert "per-round acceptance [0, 1, 1] vs [4, 4]" in str(info.value) and "1/2 prompts" in str(info.value)


def test_non_finite_servings_are_non_finite_not_history(oracle) -> None:
    """NaN differs from itself, so an unwritten aux buffer (zoo:aux_buffer_unwritten) would
    read as a history dependence; the check names the values first."""
    features = [aux_features(oracle.features(p), BOUNDARIES) for p in PROMPTS]
    nan = [torch.full_like(x, float("nan")) for x in features]
    with pytest.raises(ConformanceFailure) as info:
        assert_history_independent(prompts=PROMPTS, history="in reverse order", features=(nan, nan),
                                   tokens=None, traces=None, oracle=oracle, dtype="float32",
                                   device="cpu", engine_name="test", draft="d", check="test")
    assert [d.kind for d in info.value.diagnoses] == ["non_finite"]


def test_rows_shifted_within_every_forward_are_named_from_the_prefill(oracle) -> None:
    """zoo:aux_rows_one_late at decode time: each forward (the prefill, every verify round)
    hands row t the state of t - 1 and its first row zero. The whole feed fits no model (a
    zero at every round's start); its prefill is one forward, which the capture diagnosis
    names position_shifted, as the capture checks do (the fp32 selftest had this check say
    unrecognised / stale_or_skipped)."""
    decode = []
    for p, t in zip(PROMPTS, TOKENS, strict=True):
        feeds = _feeds(oracle, p, t)
        for f in feeds:
            f.features = torch.nn.functional.pad(f.features, (0, 0, 1, 0))[:-1]
        decode.append(feeds)
    failed = _fails(oracle, DecodeInputs(TOKENS, decode))
    assert [d.kind for d in failed.diagnoses] == ["position_shifted"], str(failed)
    assert "prefill's feed is already not training's" in str(failed)
