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
from harness.golden.oracle import Oracle
from harness.judgement import precision
from harness.judgement.assertions.capture import CaptureContext, batch_leaks, judge_capture
from harness.judgement.assertions.generation import divergence
from harness.judgement.finite import assert_finite, finite_judgement
from harness.judgement.precision import leak_evidence, traces_exact
from harness.judgement.verdict import Judgement, fail


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


def judge_decode_inputs(ctx: CaptureContext, *, decode: DecodeInputs, oracle: Oracle,
                        prompts: Sequence[Sequence[int]]) -> Judgement:
    """Is what the draft was fed while decoding what training feeds it (`ctx`: as the capture
    check's, whose judgement the rows get)? Row j of a prompt's feeds (the prefill's rows, then
    each verify round's accepted positions) at position j, with the target's features at j over
    the sequence the engine generated (`oracle`, fp32: the golden features of prompt +
    continuation). Judged in three steps, each with its own diagnosis (harness.diagnosis.decode):
    the positions exactly (they are integers), which row the re-fed rows hold, then the rows as
    the capture check judges a capture (fp32: every token within rtol; reduced precision:
    identity and the same-dtype noise floor). Rows past the continuation the engine returned (a
    last round running past max_new_tokens) have no golden counterpart and are not judged."""
    rows: list[torch.Tensor] = []
    sequences: list[list[int]] = []
    for prompt, tokens, feeds in zip(prompts, decode.tokens, decode.feeds, strict=True):
        if not feeds:
            return Judgement(False, f"prompt {list(prompt)}: the engine reported no feed of target "
                                    f"features to the draft at all (not even the prefill's)",
                             measured=0, bound="a feed per prompt", prompts=[prompt], **ctx.where)
        seq = [int(t) for t in prompt] + [int(t) for t in tokens]
        fed = torch.cat([f.features for f in feeds], dim=0)
        rows.append(fed[:len(seq)])
        sequences.append(seq)
    nan = finite_judgement("the features the draft was fed while decoding", rows)
    if nan is not None:
        return nan
    offsets = [feed_offsets([f.positions for f in feeds], [f.step_positions for f in feeds])
               for feeds in decode.feeds]
    diag = diagnose_positions(offsets)
    if diag is not None:
        i, r, what = _first_misplaced(decode)
        return Judgement(False, f"the draft's decode-time positions are not training's: prompt {i} "
                                f"feed {r} ({'the prefill' if r == 0 else f'after verify round {r}'}): "
                                f"{what} (exact integers: no tolerance). {diag.message}",
                         measured=what, bound="exact positions", diagnosis=diag,
                         prompts=[prompts[i]], **ctx.where)
    golden = [oracle.features(s).prefix(x.shape[0]) for s, x in zip(sequences, rows, strict=True)]
    width = len(ctx.training_boundaries) * golden[0].boundaries.shape[-1]
    if all(x.shape[-1] == width for x in rows):
        shift = row_shift(rows, [aux_features(g, ctx.training_boundaries) for g in golden],
                          [len(feeds[0].positions) for feeds in decode.feeds])
        if shift.named is not None and shift.prefill_in_place >= ROW_SHARE * shift.prefill_rows:
            diag = misaligned_diagnosis(shift)
            return Judgement(False, f"the rows re-fed to the draft after verify rounds are not the "
                                    f"features of their own positions. {diag.message}",
                             measured=shift.named, bound="each row at its own position", diagnosis=diag,
                             prompts=prompts, **ctx.where)
    envelopes = precision.envelopes(oracle, sequences, ctx.dtype, [x.shape[0] for x in rows])
    whole = judge_capture(ctx, features=rows, golden=golden, prompts=prompts, envelopes=envelopes,
                          verdict_only=True)
    if whole.passed:
        return whole
    # pass/fail is the whole feed's; the cause is named from the prefill's rows where they are
    # wrong already: they are the capture of one forward, which the capture diagnosis reads (a
    # row shift within each forward leaves every decode round's first row zero, which no
    # whole-feed model fits), and the re-feeds inherit its bug
    cut = [len(feeds[0].positions) for feeds in decode.feeds]
    prefill = judge_capture(
        ctx, features=[x[:c] for x, c in zip(rows, cut, strict=True)], prompts=prompts,
        golden=[g.prefix(c) for g, c in zip(golden, cut, strict=True)],
        envelopes=None if envelopes is None else [e.prefix(c) for e, c in zip(envelopes, cut, strict=True)])
    n = sum(x.shape[0] for x in rows)
    if prefill.failure is not None:
        why, named = f"({n} rows): the prefill's feed is already not training's: {prefill.failure}", prefill
    else:  # only now is the whole feed's failure worded and diagnosed
        whole = judge_capture(ctx, features=rows, golden=golden, prompts=prompts, envelopes=envelopes)
        why, named = (f"(the prefill and the re-feeds after every verify round, {n} rows): "
                      f"{whole.failure}"), whole
    # the capture judgement's failure already ends with its reproducer
    return Judgement(False, f"decode-time feeds {why}", measured=named.measured, bound=named.bound,
                     diagnosis=next(iter(named.diagnoses), None), reproduce=False)


def assert_decode_inputs_match(ctx: CaptureContext, *, decode: DecodeInputs, oracle: Oracle,
                               prompts: Sequence[Sequence[int]]) -> None:
    """`judge_decode_inputs`, raised."""
    judge_decode_inputs(ctx, decode=decode, oracle=oracle, prompts=prompts).verdict()


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

