"""Pass/fail of what the draft is fed while decoding (rows, positions, features per verify
round) and of a request's independence from the requests served before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.core.tolerances import tolerance_for
from harness.diagnosis.decode import (
    ROW_SHARE,
    decode_diagnosis,
    diagnose_positions,
    feed_offsets,
    misaligned_diagnosis,
    row_shift,
)
from harness.engines.base import DecodeInputs
from harness.golden.features import aux_features
from harness.judgement import precision
from harness.judgement.assertions.base import fail
from harness.judgement.assertions.capture import CaptureContext, assert_capture_matches, batch_leaks
from harness.judgement.assertions.generation import divergence
from harness.judgement.finite import assert_finite
from harness.judgement.precision import leak_evidence, traces_exact
from harness.reports.report import ConformanceFailure


def _first_misplaced(decode: DecodeInputs) -> tuple[int, int, str]:
    """(prompt, feed, what) of the first feed or drafted step off its position."""
    for i, feeds in enumerate(decode.feeds):
        start = 0
        for r, feed in enumerate(feeds):
            want = list(range(start, start + len(feed.positions)))
            start += len(feed.positions)
            if feed.positions != want:
                return i, r, f"rows fed at positions {feed.positions[:8]}, their sequence positions are {want[:8]}"
            steps = list(range(want[-1] + 1, want[-1] + 1 + len(feed.step_positions))) if want else []
            if feed.step_positions != steps:
                return i, r, (f"drafted steps at positions {feed.step_positions[:8]}, after a feed "
                              f"ending at {want[-1] if want else None} they belong at {steps[:8]}")
    return 0, 0, "positions differ"


def assert_decode_inputs_match(ctx: CaptureContext, *, decode: DecodeInputs, oracle,
                               prompts: Sequence[Sequence[int]]) -> None:
    """What the draft was fed while decoding is what training feeds it (`ctx`: as the capture
    check's, whose judgement the rows get): row j of a prompt's
    feeds (the prefill's rows, then each verify round's accepted positions) at position j,
    with the target's features at j over the sequence the engine generated (`oracle`, fp32:
    the golden features of prompt + continuation). Judged in three steps, each with its own
    diagnosis (harness.diagnosis.decode): the positions exactly (they are integers), which row
    the re-fed rows hold, then the rows as the capture check judges a capture (fp32: every
    token within rtol; reduced precision: identity and the same-dtype noise floor). Rows past
    the continuation the engine returned (a last round running past max_new_tokens) have no
    golden counterpart and are not judged."""
    rows: list[torch.Tensor] = []
    sequences: list[list[int]] = []
    for prompt, tokens, feeds in zip(prompts, decode.tokens, decode.feeds, strict=True):
        if not feeds:
            fail(f"prompt {list(prompt)}: the engine reported no feed of target features to the "
                 f"draft at all (not even the prefill's)", prompts=[prompt], **ctx.where)
        seq = [int(t) for t in prompt] + [int(t) for t in tokens]
        fed = torch.cat([f.features for f in feeds], dim=0)
        rows.append(fed[:len(seq)])
        sequences.append(seq)
    assert_finite("the features the draft was fed while decoding", rows)
    offsets = [feed_offsets([f.positions for f in feeds], [f.step_positions for f in feeds])
               for feeds in decode.feeds]
    diag = diagnose_positions(offsets)
    if diag is not None:
        i, r, what = _first_misplaced(decode)
        fail(f"the draft's decode-time positions are not training's: prompt {i} feed {r} "
             f"({'the prefill' if r == 0 else f'after verify round {r}'}): {what} (exact "
             f"integers: no tolerance). {diag.message}", prompts=[prompts[i]],
             diagnoses=[diag], **ctx.where)
    golden = [oracle.features(s).prefix(x.shape[0]) for s, x in zip(sequences, rows, strict=True)]
    width = len(ctx.training_boundaries) * golden[0].boundaries.shape[-1]
    if all(x.shape[-1] == width for x in rows):
        shift = row_shift(rows, [aux_features(g, ctx.training_boundaries) for g in golden],
                          [len(feeds[0].positions) for feeds in decode.feeds])
        if shift.named is not None and shift.prefill_in_place >= ROW_SHARE * shift.prefill_rows:
            diag = misaligned_diagnosis(shift)
            fail(f"the rows re-fed to the draft after verify rounds are not the features of their "
                 f"own positions. {diag.message}", prompts=prompts,
                 diagnoses=[diag], **ctx.where)
    envelopes = precision.envelopes(oracle, sequences, ctx.dtype, [x.shape[0] for x in rows])
    try:
        assert_capture_matches(ctx, features=rows, golden=golden, prompts=prompts, envelopes=envelopes)
    except ConformanceFailure as failed:
        # pass/fail is the whole feed's; the cause is named from the prefill's rows where they
        # are wrong already: they are the capture of one forward, which the capture diagnosis
        # reads (a row shift within each forward leaves every decode round's first row zero,
        # which no whole-feed model fits), and the re-feeds inherit its bug
        cut = [len(feeds[0].positions) for feeds in decode.feeds]
        try:
            assert_capture_matches(
                ctx, features=[x[:c] for x, c in zip(rows, cut, strict=True)], prompts=prompts,
                golden=[g.prefix(c) for g, c in zip(golden, cut, strict=True)],
                envelopes=None if envelopes is None else [
                    e.prefix(c) for e, c in zip(envelopes, cut, strict=True)])
        except ConformanceFailure as prefill:
            raise ConformanceFailure(f"decode-time feeds ({sum(x.shape[0] for x in rows)} rows): the "
                                     f"prefill's feed is already not training's: {prefill}",
                                     prefill.diagnoses) from None
        raise ConformanceFailure(f"decode-time feeds (the prefill and the re-feeds after every verify "
                                 f"round, {sum(x.shape[0] for x in rows)} rows): {failed}",
                                 failed.diagnoses) from None


def assert_history_independent(*, prompts: Sequence[Sequence[int]], history: str,
                               features: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]] | None,
                               tokens: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]] | None,
                               traces: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]] | None,
                               oracle, dtype: str, device: str, engine_name: str, draft: str,
                               check: str) -> None:
    """The same prompts, each served as its own request, give the same captures, tokens and
    per-round acceptance whatever was served before them and in whichever order: each pair
    holds (first serving, second serving) per prompt; `history` words what differed between
    the two. Bounds are the batch-invariance check's (captures: `batch_leaks`; tokens: a
    divergence only at a near-tie the dtype may flip). Per-round acceptance: exact in fp32
    (one greedy computation, the same trace); reduced precision: the probes' mean acceptance
    length within the `trace` bound, what a near-tie flip may move it by."""
    found: list[tuple[int, str]] = []
    if features is not None:
        # NaN differs from itself: an unwritten buffer is a non_finite engine, not a history
        assert_finite("the aux features the engine handed the draft", [*features[0], *features[1]])
        for i, (a, b) in enumerate(zip(*features, strict=True)):
            if a.shape == b.shape:
                golden, envelope = leak_evidence(oracle, prompts[i], dtype)
                bad, total, worst, bound = batch_leaks(b, a, dtype=dtype, golden=golden, envelope=envelope)
            else:
                bad, total, worst, bound = a.shape[0], a.shape[0], float("inf"), "equal shapes"
            if bad:
                found.append((i, f"captured features differ on {bad}/{total} tokens (worst relative "
                                 f"error {worst:.3g}, tolerance {bound})"))
    if tokens is not None:
        for i, (a, b) in enumerate(zip(*tokens, strict=True)):
            _, text = divergence(oracle, prompts[i], b, a, dtype, device)
            if text:
                found.append((i, f"greedy speculative tokens differ: {text}"))
    if traces is not None:
        tol = tolerance_for(dtype)
        if traces_exact(dtype):
            found += [(i, f"per-round acceptance {list(b)[:12]} vs {list(a)[:12]} (fp32: exact)")
                      for i, (a, b) in enumerate(zip(*traces, strict=True)) if list(a) != list(b)]
        else:
            means = [1 + sum(sum(t) for t in side) / max(1, sum(len(t) for t in side)) for side in traces]
            if abs(means[1] - means[0]) > tol.trace * means[0]:
                found.append((0, f"mean acceptance length over the probes {means[1]:.3f} vs "
                                 f"{means[0]:.3f} (allowed relative gap {tol.trace:g} for {dtype})"))
    if found:
        i, what = found[0]
        diag = decode_diagnosis(
            "history_dependent",
            f"served again {history}, {len({j for j, _ in found})}/{len(prompts)} prompts changed; "
            f"first: prompt {i}: {what}", history=history, changed=[w for _, w in found[:8]])
        fail(f"the engine's output depends on request order or history ({history}): "
             f"{len(found)} difference(s); prompt {list(prompts[i])}: {what}. {diag.message}",
             draft=draft, engine_name=engine_name, prompts=prompts, diagnoses=[diag], check=check)

