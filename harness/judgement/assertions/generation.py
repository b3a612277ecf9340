"""The judgements of what an engine generates: greedy divergence between two generations,
excused only at a near-tie of the target's logits that precision can flip, and the
losslessness and generation batch-invariance judgements built on it; the drafted tokens
inside the draft vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.core.tolerances import tolerance_for
from harness.diagnosis.draft_side import fc_diagnosis
from harness.diagnosis.record import Diagnosis
from harness.judgement.precision import is_reduced
from harness.judgement.verdict import Judgement


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_bound(oracle, context: Sequence[int], pair: Sequence[int], dtype: str,
                   device: str = "cpu") -> tuple[float, float]:
    """(fp32 logit gap between the two tokens of `pair` after `context`, the gap `dtype` on
    `device` may flip): fp32 excuses summation order only; reduced precision adds what the
    same-dtype reference's logits of those two tokens actually moved, noise_factor times, and
    the rounding of the logits themselves (harness.core.tolerances.REASONS['near_tie'])."""
    tol = tolerance_for(dtype)
    logits, _ = oracle.top2_logits(context)
    idx = torch.tensor(list(pair))
    gap = float((logits[idx[0]] - logits[idx[1]]).abs())
    bound = tol.near_tie
    if is_reduced(dtype):
        low = oracle.reference_logits(context, dtype, device)
        moved = float((low[idx] - logits[idx]).abs().sum())
        bound = max(bound, tol.noise_factor * moved + 2 * tol.unit * float(logits[idx].abs().max()))
    return gap, bound


def divergence(oracle, prompt: Sequence[int], got: Sequence[int], want: Sequence[int],
               dtype: str, device: str = "cpu") -> tuple[bool, str | None]:
    """(excused near-tie?, failure text or None) for two greedy continuations of `prompt`."""
    j = first_divergence(got, want)
    if j is None:
        return False, None
    if j >= min(len(got), len(want)):
        return False, f"prompt {list(prompt)}: lengths differ ({len(got)} vs {len(want)} tokens)"
    gap, bound = near_tie_bound(oracle, list(prompt) + list(want[:j]), (got[j], want[j]), dtype, device)
    if gap <= bound:
        return True, None
    return False, (f"prompt {list(prompt)}: token {j} is {got[j]} vs {want[j]} (fp32 logit gap "
                   f"{gap:.3g} > near-tie bound {bound:.3g} for {dtype} on {device})")


def judge_lossless(oracle, batch: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]],
                   plain: Sequence[Sequence[int]], dtype: str, device: str, *, draft: str,
                   engine_name: str) -> Judgement:
    """Speculative greedy output equals non-speculative greedy output on every prompt of
    `batch`, a divergence excused only at a near-tie `dtype` may flip (`divergence`);
    `measured["excused_near_ties"]` counts the excused ones for the report."""
    excused, failures = 0, []
    for prompt, s, p in zip(batch, speculative, plain, strict=True):
        tie, failure = divergence(oracle, prompt, s, p, dtype, device)
        excused += tie
        if failure:
            failures.append(failure + " (with vs without speculation)")
    measured = {"excused_near_ties": excused, "prompts": len(batch), "differing": len(failures)}
    why = (f"speculative output differs from greedy on {len(failures)}/{len(batch)} prompts "
           f"({excused} near-ties excused): " + "; ".join(failures[:3])) if failures else \
        f"speculative output equals greedy on {len(batch)} prompts ({excused} near-ties excused)"
    return Judgement(not failures, why, measured=measured, bound="equal but for near-ties",
                     draft=draft, engine_name=engine_name, prompts=batch)


def judge_generation_batch_invariance(oracle, probe: Sequence[int], inside: Sequence[int],
                                      alone: Sequence[int], *, batch: Sequence[Sequence[int]],
                                      position: int, size: int, companion_lengths: Sequence[int],
                                      dtype: str, device: str, draft: str, engine_name: str) -> Judgement:
    """A prompt's greedy speculative output is the same alone and at `position` of `batch`, a
    divergence excused only at a near-tie `dtype` may flip. A failure is `batch_dependent`: the
    first differing token is the evidence."""
    _, failure = divergence(oracle, probe, inside, alone, dtype, device)
    where = {"draft": draft, "engine_name": engine_name, "prompts": batch}
    if not failure:
        return Judgement(True, "the same greedy output alone and in the batch", bound="near-tie", **where)
    text = (f"greedy speculative output of a prompt changes with its batch (position "
            f"{position} of {size}, companion lengths {list(companion_lengths)}): {failure}")
    diag = Diagnosis(kind="batch_dependent", message=f"{text}; root cause: batch-dependent "
                     "generation — the same prompt decodes differently alone and in a batch, "
                     "beyond the fp32 near-tie noise (the evidence: the first differing token)",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
                     details={"position": position, "batch_size": size})
    return Judgement(False, text, measured=failure, bound="near-tie", diagnosis=diag, **where)


def judge_drafted_vocab(proposed: Sequence[Sequence[int]], t2d: torch.Tensor, draft_vocab_size: int, *,
                        draft: str, engine_name: str, prompts: Sequence[Sequence[int]]) -> Judgement:
    """Every token the engine drafted (`proposed`, per prompt) lies inside the draft vocabulary
    (`t2d`, the trained mask over target ids). Tokens outside it that sit below
    `draft_vocab_size` are the signature of d2t read as absolute ids, which the diagnosis
    names (the acceptance explainer re-serves the prompts to verify it)."""
    where = {"draft": draft, "engine_name": engine_name, "prompts": prompts}
    drafted = [t for row in proposed for t in row]
    if not drafted:
        return Judgement(False, f"{engine_name} drafted no tokens: speculation did not run",
                         measured=0, bound="drafted tokens", **where)
    outside = sorted({t for t in drafted if not bool(t2d[t])})
    if not outside:
        return Judgement(True, f"all {len(drafted)} drafted tokens lie inside the draft vocabulary",
                         measured=0, bound="t2d", **where)
    as_draft_ids = [t for t in outside if t < draft_vocab_size]
    hint = (f"{len(as_draft_ids)}/{len(outside)} of them are below draft_vocab_size "
            f"{draft_vocab_size}, the signature of d2t read as absolute ids")
    diag = fc_diagnosis("d2t_absolute", f"drafted tokens {outside[:8]} are not in t2d; {hint}")
    return Judgement(False, diag.message, measured=len(outside), bound="t2d", diagnosis=diag, **where)
