"""Pass/fail of the aux states an engine hands the draft: per token against the fp32
training boundaries (fp32), by identity against the precision envelope (reduced precision), and a
prompt's capture inside a batch against its capture alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from harness.core.boundaries import Convention
from harness.core.tolerances import tolerance_for, tolerance_text
from harness.diagnosis.capture import diagnose_capture
from harness.diagnosis.evidence import seen_per_slot
from harness.diagnosis.fingerprint import relative_errors
from harness.diagnosis.identity import WRONG, classify_capture, classify_tokens, noise_allowance
from harness.diagnosis.placement import placement_diagnosis
from harness.diagnosis.record import Diagnosis, unexplained
from harness.engines.base import Engine
from harness.golden.bundle import DraftSpec
from harness.golden.envelope import Envelope
from harness.golden.features import TargetFeatures
from harness.golden.oracle import Oracle
from harness.judgement import precision
from harness.judgement.assertions.base import worst_tokens
from harness.judgement.finite import finite_judgement
from harness.judgement.precision import allowance_floor, is_reduced
from harness.judgement.verdict import Judgement


def _strict_off_tokens(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                       training_boundaries: Sequence[int], rtol: float) -> tuple[int, int, float]:
    """(tokens off, tokens, worst relative error) for an fp32 engine: every token of every
    slot within rtol, judged slot by slot so a slot of small norm cannot hide inside the
    concatenation."""
    hidden = golden[0].boundaries.shape[-1]
    off_total = tokens = 0
    worst = 0.0
    for x, g in zip(features, golden, strict=True):
        off = torch.zeros(x.shape[0], dtype=torch.bool)
        for s, b in enumerate(training_boundaries):
            err = relative_errors(x[:, s * hidden:(s + 1) * hidden], g.boundaries[b])
            worst = max(worst, float(err.max())) if err.numel() else worst
            off |= err > rtol
        off_total += int(off.sum())
        tokens += x.shape[0]
    return off_total, tokens, worst


Prompts = Sequence[Sequence[int]]


@dataclass(frozen=True)
class CaptureContext:
    """Everything a capture judgement needs besides the states judged: what training fed
    (`training_boundaries`, from the draft's `config_ids`), the engine's dtype, who served it
    (named in the reproducer; its `engine_convention` words the fixing id list, its declared
    `pipeline_stages` name a capture of the last stage's slots alone, harness.diagnosis.placement),
    and which check asks.

    The rest serves only the diagnosis, never pass/fail, and is asked for only on a mismatch:
    `more_evidence`, more prompts with the engine's and the golden features, so that a shrunk
    one-token example is diagnosed with enough evidence (a lone zero row fits many causes);
    `alone`, the engine's features of the given prompts each captured on its own (the evidence
    that tells a batch-dependent capture from every other cause), used where the diagnosed rows
    were captured in a batch: `in_batch` (default: more than one prompt), or rows of
    `more_evidence`.

    One object instead of a dozen keywords, because every caller (the capture checks, the
    decode check, the acceptance explainer, the layer-id sweep, the doctor) passes the same
    facts about one engine serving one draft; `for_engine` reads them off the engine."""

    training_boundaries: Sequence[int]
    config_ids: Sequence[int]
    dtype: str
    engine_name: str
    draft: str
    check: str
    engine_convention: str | Convention | None = None
    pipeline_stages: Sequence[int] | None = None
    alone: Callable[[Prompts], Sequence[torch.Tensor]] | None = None
    more_evidence: Callable[[], tuple[Prompts, Sequence[torch.Tensor], Sequence[TargetFeatures]]] | None = None
    in_batch: bool | None = None

    @classmethod
    def for_engine(cls, engine: Engine, spec: DraftSpec, draft: str, check: str,
                   **rest: object) -> CaptureContext:
        """The context of `engine` serving the bundle draft `spec` (named `draft`) in its own
        dtype; `rest`: the optional fields."""
        return cls(training_boundaries=spec.boundaries, config_ids=spec.layer_ids,
                   dtype=engine.options.dtype, engine_name=engine.name, draft=draft, check=check,
                   engine_convention=engine.convention, **rest)  # type: ignore[arg-type]

    @property
    def where(self) -> dict[str, str]:
        """The reproducer's arguments to `fail`: which draft, engine and check."""
        return {"draft": self.draft, "engine_name": self.engine_name, "check": self.check}


def _wrong_width(widths: set[int], expected_width: int, training_boundaries: Sequence[int],
                 hidden: int, diag: Diagnosis, **where: Any) -> Judgement:
    """The failed judgement of features of another width than training's fc reads: there is no
    slot to compare token by token, so the widths and the diagnosis are all it says."""
    return Judgement(False, f"the engine handed the draft {sorted(widths)}-wide features, training "
                            f"fed fc {expected_width} = {len(training_boundaries)} aux states x "
                            f"{hidden}; {diag.message}",
                     measured=sorted(widths), bound=expected_width, diagnosis=diag, **where)


def _evidence(ctx: CaptureContext, features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
              prompts: Prompts) -> tuple[list[torch.Tensor], list[TargetFeatures], Sequence[torch.Tensor] | None]:
    """(features, golden features, solo captures or None): all the evidence the diagnosis of a
    capture that is off reads, the context's extra prompts and solo captures included where it
    has them (solo captures only where the rows were captured in a batch)."""
    seen_p, seen_x, seen_g = list(prompts), list(features), list(golden)
    if ctx.more_evidence is not None:
        more_p, more, more_golden = ctx.more_evidence()
        seen_p, seen_x, seen_g = [*seen_p, *more_p], [*seen_x, *more], [*seen_g, *more_golden]
    batched = len(features) > 1 if ctx.in_batch is None else ctx.in_batch
    solo = ctx.alone(seen_p) if ctx.alone is not None and (batched or len(seen_x) > len(features)) else None
    return seen_x, seen_g, solo


def judge_capture(ctx: CaptureContext, *, features: Sequence[torch.Tensor],
                  golden: Sequence[TargetFeatures], prompts: Prompts,
                  envelopes: Sequence[Envelope] | None = None, verdict_only: bool = False) -> Judgement:
    """Did the engine hand the draft, slot by slot and token by token, what training used?
    (`ctx`: which boundaries, which dtype, who served them, and the diagnosis' extra evidence.)

    fp32: every token within the strict bound. Reduced precision: no token may be what a
    wiring bug leaves (another golden state, zeros, a state no nearer its boundary than zero),
    and no slot's median error may exceed the envelope's; `envelopes` (required there) holds
    per prompt the precision envelope, the prompt computed by correct implementations in the
    engine's dtype (`Oracle.envelope`). Tokens precision makes ambiguous, and routing near-ties,
    pass and are reported in the diagnosis' details["precision"].

    The verdict comes first and the diagnosis after it, once: a capture that is off is
    diagnosed on all the evidence the context can gather (its extra prompts, solo captures) in
    one pass. Only a reduced-precision pass is screened first (its diagnosis records which
    boundaries the slots hold, and one whose labels are not as trained is read on all the
    evidence as before). Non-finite features fail at once (harness.judgement.finite): there
    is nothing to compare. `verdict_only`: pass or fail and nothing else, neither worded nor
    diagnosed (the decode check words a failed feed from its prefill where that fails too)."""
    training_boundaries, dtype = ctx.training_boundaries, ctx.dtype
    where = {**ctx.where, "prompts": prompts}
    nan = finite_judgement("the aux features the engine handed the draft", features)
    if nan is not None:
        return nan
    hidden = golden[0].boundaries.shape[-1]
    expected_width = len(training_boundaries) * hidden
    widths = {int(x.shape[-1]) for x in features}
    placed = len(widths) == 1 and placement_diagnosis(
        next(iter(widths)), expected_width, hidden, source="the adapter reported",
        training_boundaries=training_boundaries, pipeline_stages=ctx.pipeline_stages)
    if placed:  # a width only a placement leaves: no state to fingerprint slot by slot
        return _wrong_width(widths, expected_width, training_boundaries, hidden, placed, **where)
    tol = tolerance_for(dtype)
    if is_reduced(dtype) and envelopes is None:
        raise ValueError(f"judging {dtype} capture needs the {dtype} precision envelope of "
                         f"the same prompts (Oracle.envelope); pass envelopes=")
    as_trained = widths == {expected_width}
    found = None
    if is_reduced(dtype) and as_trained:
        assert envelopes is not None
        found = classify_capture(features, golden, training_boundaries, envelopes,
                                 noise_factor=tol.noise_factor, separation=tol.separation,
                                 floor=allowance_floor())
    off = total = 0
    worst = 0.0
    if not is_reduced(dtype) and as_trained:
        off, total, worst = _strict_off_tokens(features, golden, training_boundaries, tol.rtol)
    # the reduced-precision judgement failed a capture whose labels may all be as trained: the
    # diagnosis still looks for the fitted causes
    judged_off = found is not None and not found.ok
    if verdict_only:
        passed = as_trained and not off and not judged_off
        return Judgement(passed, f"the capture is {'' if passed else 'not '}as trained (verdict only)",
                         **where)
    diagnose = partial(diagnose_capture, training_boundaries=training_boundaries,
                       engine_convention=ctx.engine_convention, config_ids=ctx.config_ids,
                       rtol=tol.rtol, separation=tol.separation, judged_off=judged_off)
    if not as_trained or off or judged_off:
        # off: every slot label that is not as trained is what the diagnosis reads (a wrong
        # slot count, or in fp32 a token beyond rtol, makes the slot fingerprint off too)
        seen_x, seen_g, alone = _evidence(ctx, features, golden, prompts)
        diag = diagnose(seen_x, seen_g, alone=alone)
    else:
        diag = diagnose(features, golden)
        if diag.kind != "ok":
            # a reduced-precision pass whose slot labels are not all as trained: recorded on
            # all the evidence, as the diagnosis of a failure would be
            seen_x, seen_g, alone = _evidence(ctx, features, golden, prompts)
            diag = diagnose(seen_x, seen_g, alone=alone)
    if not as_trained:
        return _wrong_width(widths, expected_width, training_boundaries, hidden, diag, **where)
    bound = tolerance_text(dtype, golden[0].num_layers)
    if found is None:  # fp32
        return Judgement(not off, f"aux features differ from training on {off}/{total} tokens (worst "
                                  f"relative error {worst:.3g}; tolerance: {bound}). {diag.message}"
                         if off else diag.message,
                         measured={"tokens_off": off, "tokens": total, "worst_rel_error": worst},
                         bound=bound, diagnosis=diag, **where)
    diag.details["precision"] = found.summary()
    measured = {"wrong": len(found.wrong), "slot_tokens": found.tokens, **found.counts}
    if found.ok:
        # the judgement decides: tokens precision leaves undecided are ambiguous, not skipped
        diag = replace(diag, kind="ok", message=(
            f"all {len(training_boundaries)} slots are the training boundaries "
            f"{list(training_boundaries)} at {dtype}: {found.counts['exact']}/{found.tokens} "
            f"slot-tokens within the precision envelope, {found.counts['precision_outlier']} precision "
            f"outliers identified as their own boundary, {found.counts['ambiguous']} ambiguous "
            f"(a correct {dtype} implementation itself cannot be told apart there), "
            f"{found.counts['routing_tie']} at MoE routing near-ties (neither evidence of a bug "
            f"nor of the wiring)."))
        return Judgement(True, diag.message, measured=measured, bound=bound, diagnosis=diag, **where)
    if diag.kind == "ok":
        # no known class fits at this dtype's tolerance: say what was seen, never a class by
        # elimination (issue #13)
        seen = seen_per_slot(features, golden, training_boundaries, tol.rtol)
        diag = replace(diag, kind="unrecognised", message=(
            "every slot is nearest its training boundary, yet some slot's typical error exceeds "
            f"the {dtype} precision envelope: no known class fits (a wrong norm, scale or dtype cast "
            "moves every token a little). Seen per slot: " + "; ".join(
                f"slot {d['slot']} (training b={d['expected']}) nearest "
                + ", ".join(f"{c['state']} at {c['median_rel_error']:.3g}" for c in d["nearest"])
                for d in seen) + ". Confidence margin: none, no explanation fits."),
            details={**diag.details, "seen": seen, "confidence_margin": 0.0})
    shown = "; ".join(f"prompt {p} slot {s} token {t}: {why}" for p, s, t, why in found.wrong[:3])
    drift = "; ".join(f"slot {s} median error {m:.3g} > {a:.3g}" for s, m, a in found.drift)
    return Judgement(
        False, f"aux features are not the training boundaries on {len(found.wrong)}/{found.tokens} "
               f"slot-tokens" + (f" ({shown})" if shown else "")
               + (f"; drifting beyond the {dtype} precision envelope: {drift}" if drift else "")
               + f" ({found.counts['ambiguous']} more ambiguous at {dtype}, "
               f"{found.counts['routing_tie']} at MoE routing near-ties, "
               f"{found.counts['precision_outlier']} precision outliers identified as their own "
               f"boundary; tolerance: {bound}). {diag.message}",
        measured=measured, bound=bound, diagnosis=diag, **where)


def assert_capture_matches(ctx: CaptureContext, *, features: Sequence[torch.Tensor],
                           golden: Sequence[TargetFeatures], prompts: Prompts,
                           envelopes: Sequence[Envelope] | None = None) -> Diagnosis:
    """`judge_capture`, raised: the capture check's failure, or on a pass its diagnosis (which
    boundaries the slots hold, and in reduced precision details["precision"])."""
    diag = judge_capture(ctx, features=features, golden=golden, prompts=prompts, envelopes=envelopes).verdict()
    assert diag is not None  # a capture judgement always carries its diagnosis
    return diag


def judge_capture_oracle(ctx: CaptureContext, *, features: Sequence[torch.Tensor], oracle: Oracle,
                         prompts: Prompts) -> Judgement:
    """`judge_capture` with the golden features of `prompts` from `oracle` and, in reduced
    precision, their precision envelopes."""
    return judge_capture(ctx, features=features, golden=[oracle.features(p) for p in prompts],
                         prompts=prompts, envelopes=precision.envelopes(oracle, prompts, ctx.dtype))


def assert_capture_matches_oracle(ctx: CaptureContext, *, features: Sequence[torch.Tensor],
                                  oracle: Oracle, prompts: Prompts) -> Diagnosis:
    """`judge_capture_oracle`, raised (see `assert_capture_matches`)."""
    diag = judge_capture_oracle(ctx, features=features, oracle=oracle, prompts=prompts).verdict()
    assert diag is not None  # a capture judgement always carries its diagnosis
    return diag


def batch_leaks(inside: torch.Tensor, alone: torch.Tensor, *, dtype: str,
                golden: TargetFeatures | None = None,
                envelope: Envelope | None = None) -> tuple[int, int, float, str]:
    """(tokens that leak, tokens, worst relative error, the bound in words) for one prompt's
    features inside a batch against alone. fp32: any token beyond rtol leaks. Reduced
    precision: two runs of one engine may each round their own way, so a token leaks only
    where it differs beyond the noise allowance of its slot (the precision envelope's error,
    `envelope`) AND is then what a wiring bug leaves, judged against the boundary the slot holds
    alone (its modal nearest boundary: batch invariance asks for the same state, whether or
    not it is the one training used, which is the capture check's question)."""
    tol = tolerance_for(dtype)
    if not is_reduced(dtype) or golden is None or envelope is None:
        bad, total, worst = worst_tokens([inside], [alone], tol.rtol)
        return bad, total, worst, f"{tol.rtol:g}"
    hidden = golden.boundaries.shape[-1]
    floor = allowance_floor()
    leak = torch.zeros(inside.shape[0], dtype=torch.bool)
    worst = 0.0
    for s in range(inside.shape[-1] // hidden):
        x, y = inside[:, s * hidden:(s + 1) * hidden], alone[:, s * hidden:(s + 1) * hidden]
        b = int(relative_errors(y[None], golden.boundaries).argmin(dim=0).mode().values)
        err = relative_errors(x, y)
        worst = max(worst, float(err.max()))
        tc = classify_tokens(x.float(), golden, b, envelope, noise_factor=tol.noise_factor,
                             separation=tol.separation, floor=floor)
        beyond = err > noise_allowance(envelope.error(b, golden), noise_factor=tol.noise_factor,
                                       floor=floor)
        leak |= beyond & torch.tensor([c == WRONG for c in tc.classes])
    return int(leak.sum()), inside.shape[0], worst, tolerance_text(dtype, golden.num_layers)



def diagnose_batch_leak(together: Sequence[torch.Tensor], solo: Sequence[torch.Tensor],
                        golden: Sequence[TargetFeatures], training_boundaries: Sequence[int], *,
                        dtype: str, engine_convention: str | None, config_ids: Sequence[int],
                        found: str) -> Diagnosis:
    """The cause of a failed batch-invariance check: every member of the batch captured in it
    (`together`) and alone (`solo`), against training. The batch capture first (solo captures
    as the batch evidence), then, where the batch matches training, the solo captures (then it
    is the prompt alone that is off). Where both match training within the diagnosis'
    tolerance yet differ from each other beyond the check's bound (`found`: the check's own
    figures), no cause fits: `unrecognised` with the per-prompt gap between the two captures as
    the raw evidence, never `ok` on a failed check (issue #31, item 4)."""
    tol = tolerance_for(dtype)
    diagnose = partial(diagnose_capture, golden=golden, training_boundaries=training_boundaries,
                       engine_convention=engine_convention, config_ids=config_ids,
                       rtol=tol.rtol, separation=tol.separation)
    diag = diagnose(together, alone=solo)
    if diag.kind == "ok" and precision.is_reduced(dtype):
        # reduced precision: the check judged tokens against the precision envelope and found
        # some in the batch that no correct implementation gives (not a routing tie, beyond the
        # token's allowance) while alone they hold their boundary; the diagnosis' label
        # tolerance keeps a token that far from its boundary only as "undecidable". Asked as a
        # failed judgement, the batch evidence names that ("right alone, wrong in a batch") —
        # only a batch kind is taken from it, with its own margin (a shrunk example of
        # zoo:aux_batch_leak in bf16 left 1 such token of 26, which read `unrecognised`)
        judged = diagnose(together, alone=solo, judged_off=True)
        if judged.kind in ("batch_dependent", "request_mixed"):
            return judged
    if diag.kind == "ok":
        diag = diagnose(solo)
    if diag.kind != "ok":
        return diag
    gaps = [{"prompt": i, "tokens": int(x.shape[0]),
             "worst_rel_error_batch_vs_alone": float(relative_errors(x.float(), y.float()).max())
             if x.shape == y.shape and x.shape[0] else None,
             "shapes": [list(x.shape), list(y.shape)]}
            for i, (x, y) in enumerate(zip(together, solo, strict=True))]
    shown = "; ".join(f"prompt {g['prompt']}: {g['worst_rel_error_batch_vs_alone']:.3g}"
                      for g in gaps if g["worst_rel_error_batch_vs_alone"] is not None)
    return unexplained(diag, f"{found}; the batch and the solo captures are each within "
                             f"{tol.rtol:g} of the training boundaries {list(training_boundaries)} "
                             f"but differ from each other (worst relative error per prompt, batch "
                             f"against alone: {shown}): a batch-size-dependent numeric path no "
                             f"known cause describes", evidence={"batch_vs_alone": gaps})


def judge_batch_invariance(ctx: CaptureContext, *, inside: torch.Tensor, alone: torch.Tensor,
                           probe: Sequence[int], batch: Prompts, position: int,
                           companion_lengths: Sequence[int], oracle: Oracle) -> Judgement:
    """A prompt's features are the same at `position` of `batch` (`inside`) as captured alone
    (`alone`), judged by `batch_leaks`. On a failure the cause is diagnosed once
    (`diagnose_batch_leak`) on every member of the batch captured in it and alone: the
    context's `more_evidence` (the batch again) and `alone` (each member on its own)."""
    nan = finite_judgement("the aux features the engine handed the draft", [alone, inside])
    if nan is not None:
        return nan
    bad = total = 0
    worst, bound = 0.0, ""
    if inside.shape == alone.shape:
        golden, envelope = precision.leak_evidence(oracle, probe, ctx.dtype)
        bad, total, worst, bound = batch_leaks(inside, alone, dtype=ctx.dtype, golden=golden,
                                               envelope=envelope)
    measured = {"tokens_off": bad, "tokens": total, "worst_rel_error": worst}
    where = {"draft": ctx.draft, "engine_name": ctx.engine_name, "prompts": batch}
    if inside.shape == alone.shape and not bad:
        return Judgement(True, f"the same features alone and in the batch (tolerance {bound})",
                         measured=measured, bound=bound, **where)
    assert ctx.more_evidence is not None and ctx.alone is not None, "the batch evidence is needed"
    _, together, golden_batch = ctx.more_evidence()
    solo = ctx.alone(batch)
    found = (f"{tuple(inside.shape)} draft features inside the batch, {tuple(alone.shape)} alone"
             if inside.shape != alone.shape else
             f"{bad}/{total} tokens off, worst relative error {worst:.3g} (tolerance {bound})")
    diag = diagnose_batch_leak(together, solo, golden_batch, ctx.training_boundaries, dtype=ctx.dtype,
                               engine_convention=ctx.engine_convention, config_ids=ctx.config_ids,
                               found=found)
    return Judgement(False, f"probe prompt {probe} gets different draft features at batch position "
                            f"{position} of {len(batch)} (companion lengths {list(companion_lengths)}): "
                            f"{found}" + ("; the engine's padding/packing leaks into the aux states"
                                          if diag.kind in ("batch_dependent", "request_mixed") else "")
                     + f". {diag.message}", measured=measured, bound=bound, diagnosis=diag, **where)
