"""Which row the draft is re-fed, told in reduced precision (issue #31: bf16 row identity for
decode_misaligned, with its margin). The committed target's greedy continuation of prompt [0]
loops with period 2 (9, 140, 9, 140, ...): the states at the repeats lie within bf16's noise
of each other, so most re-fed rows are near several positions alike and identify none. The
rows are fed here by envelope members in bf16 (other kernels than the fp32 golden, harness.
models.variants): a correct feed must never be named a shift, and a feed one row late must be
named decode_misaligned, one row late, with its margin over the runner-up (the shift two
positions away that the loop leaves almost as consistent), never a capture kind."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from golden_oracle import committed_oracle

from harness.diagnosis.decode import PARTIAL_MIN, row_shift
from harness.engines.base import DecodeInputs, DraftFeed
from harness.golden.envelope import envelope_members
from harness.golden.features import aux_features
from harness.judgement.assertions import CaptureContext
from harness.judgement.assertions.decode import judge_decode_inputs

DRAFT = "specforge-default"
ROUNDS = (3, 1, 4, 2)  # rows re-fed per verify round (accepted + 1), repeated to the end
MEMBERS = [m.name for m in envelope_members(False)][:3]


@cache
def looping() -> list[int]:
    """Prompt [0] and the committed target's greedy continuation (31 tokens)."""
    o, seq = committed_oracle(), [0]
    with torch.no_grad():
        for _ in range(31):
            seq.append(int(o.target(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq


@cache
def rows(member: str, seq: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the member's bf16 fc input, the fp32 golden's) at every position of `seq`."""
    o = committed_oracle()
    b = o.spec(DRAFT).boundaries
    got = aux_features(o.envelopes.member_features(member, list(seq), "bfloat16"), b).float()
    return got, aux_features(o.features(list(seq)), b)


def one_late(x: torch.Tensor, prefill: int) -> torch.Tensor:
    """Re-fed rows one late: row t holds position t - 1's features (zoo:decode_rows_one_late)."""
    return torch.cat([x[:prefill], x[prefill - 1:-1]])


def test_the_continuation_repeats_so_rows_alone_cannot_identify_positions() -> None:
    """The premise: on this continuation almost every re-fed row is near several positions in
    bf16, which the old rule (a shift named only where 80% of rows identify it alone) read as
    no shift at all."""
    seq = looping()
    assert seq[3:7] == seq[1:5], f"the committed target no longer loops on [0]: {seq}"
    got, ref = rows(MEMBERS[0], tuple(seq))
    shift = row_shift([one_late(got, 1)], [ref], [1])
    assert shift.ambiguous >= 0.8 * shift.rows and shift.identified[-1] < 0.2 * shift.rows, shift


@pytest.mark.parametrize("member", MEMBERS)
def test_rows_one_late_in_bf16_are_named_with_their_margin(member: str) -> None:
    got, ref = rows(member, tuple(looping()))
    shift = row_shift([one_late(got, 1)], [ref], [1])
    assert shift.named == -1 and shift.systematic == -1, shift
    assert shift.consistent[-1] == shift.rows and shift.consistent.get(0, 0) == 0, shift
    other, fits = shift.runner_up
    assert other == 1 and shift.margin == shift.rows - fits >= PARTIAL_MIN, shift


@pytest.mark.parametrize("member", MEMBERS)
def test_a_correct_feed_in_bf16_is_never_named_a_shift(member: str) -> None:
    """Correct rows from another implementation, on the loop and on every pinned prompt."""
    o = committed_oracle()
    for seq in [looping(), *o.pinned_prompts]:
        if len(seq) < 2:
            continue
        got, ref = rows(member, tuple(seq))
        shift = row_shift([got], [ref], [1])
        assert shift.named is None, (seq, shift)


def _feeds(x: torch.Tensor, prefill: int) -> list[DraftFeed]:
    feeds, start, r = [DraftFeed(list(range(prefill)), x[:prefill].clone())], prefill, 0
    while start < x.shape[0]:
        n = min(ROUNDS[r % len(ROUNDS)], x.shape[0] - start)
        feeds.append(DraftFeed(list(range(start, start + n)), x[start:start + n].clone()))
        start, r = start + n, r + 1
    return feeds


def test_the_bf16_judgement_names_rows_one_late_not_a_capture_kind() -> None:
    """Through the decode judgement in bf16: the failure is decode_misaligned, one row late,
    with the margin in the message (was: the capture judgement's stale_or_skipped)."""
    o, seq = committed_oracle(), looping()
    got, _ = rows(MEMBERS[1], tuple(seq))
    spec = o.spec(DRAFT)
    ctx = CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype="bfloat16",
                         engine_name="test", draft=DRAFT, check="test")
    judged = judge_decode_inputs(ctx, decode=DecodeInputs([seq[1:]], [_feeds(one_late(got, 1), 1)]),
                                 oracle=o, prompts=[[0]])
    assert not judged.passed
    assert [d.kind for d in judged.diagnoses] == ["decode_misaligned"], str(judged.failure)[:600]
    text = str(judged.failure)
    assert "one row late" in text and "margin over the runner-up" in text, text[:800]
    assert judged.diagnoses[0].details["confidence_margin"] >= PARTIAL_MIN
