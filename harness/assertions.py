"""Assertion helpers whose failure text explains: what was compared, the tolerance and why,
what the engine did instead (the diagnosis), and a minimal reproducer.

A check calls one of these and nothing else decides pass/fail: every check fails through
`fail` (or a helper built on it), so every failure is worded the same way, ends with the
command that reproduces it and carries its diagnoses into report.json. Tolerances come from
`harness.tolerances`; the wording of causes from `harness.diagnosis`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

import pytest
import torch

from harness.diagnosis.capture import diagnose_capture
from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.draft_side import diagnose_fc
from harness.diagnosis.fingerprint import relative_errors
from harness.diagnosis.identity import WRONG, classify_capture, classify_tokens, noise_allowance
from harness.diagnosis.record import Diagnosis
from harness.diagnosis.throughput import throughput_diagnosis
from harness.engines.base import Capability, Engine
from harness.finite import assert_finite
from harness.golden.features import TargetFeatures
from harness.report import ConformanceFailure
from harness.throughput import SpeedupFinding
from harness.tolerances import tolerance_for, tolerance_text

__all__ = ["ConformanceFailure", "FcVerdict", "assert_canary_accepts", "assert_capture_matches",
           "assert_capture_matches_oracle", "assert_convention_as_declared", "assert_fc_matches",
           "assert_fix_holds", "assert_speedup_consistent", "batch_leaks", "crash_failure",
           "divergence", "fail", "failure", "fc_allowances", "judge_fc", "near_tie_bound",
           "require", "worst_tokens"]


def require(engine: Engine, capability: Capability) -> None:
    """Skip, with the reason printed, what this engine cannot do."""
    if capability not in engine.capabilities:
        pytest.skip(f"{engine.name} does not declare the {capability.value!r} capability")


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


def current_check() -> str:
    """The running check's function name (pytest's PYTEST_CURRENT_TEST, parameters dropped):
    what `-k` selects to rerun it."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.split("::")[-1].split(" ")[0].split("[")[0] or "<check>"


def reproducer(engine_name: str | None, draft: str, prompts: Sequence[Sequence[int]] | None = None,
               check: str | None = None) -> str:
    """The command that reruns one check for one draft (and the prompts it failed on)."""
    engine = f" --engine {engine_name}" if engine_name else ""
    line = (f"reproduce: eagle3-conformance run{engine} --draft {draft} "
            f"-k {check or current_check()}")
    if prompts:
        shown = [list(p) for p in prompts[:3]]
        more = f" (+{len(prompts) - 3} more)" if len(prompts) > 3 else ""
        line += f"  # prompts {shown}{more}"
    return line


def failure(message: str, *, draft: str, engine_name: str | None = None,
            prompts: Sequence[Sequence[int]] | None = None, diagnoses: Sequence[Diagnosis] = (),
            check: str | None = None) -> ConformanceFailure:
    """A check's failure: `message`, then the reproducer; `diagnoses` go to report.json."""
    return ConformanceFailure(f"{message}\n{reproducer(engine_name, draft, prompts, check)}",
                              list(diagnoses))


def fail(message: str, *, draft: str, engine_name: str | None = None,
         prompts: Sequence[Sequence[int]] | None = None, diagnoses: Sequence[Diagnosis] = (),
         check: str | None = None) -> NoReturn:
    """Fail the running check (see `failure`)."""
    raise failure(message, draft=draft, engine_name=engine_name, prompts=prompts,
                  diagnoses=diagnoses, check=check)


def crash_failure(crash: BaseException, *, layer_ids: Sequence[int], target_hidden: int,
                  engine_name: str, draft: str) -> ConformanceFailure:
    """An engine that crashed serving the draft failed the check; the crash is diagnosed from
    its message with the draft's own ids (harness.diagnosis.crash)."""
    return failure(str(crash), draft=draft, engine_name=engine_name,
                   diagnoses=[crash_diagnosis(str(crash), layer_ids, target_hidden)])


def assert_capture_matches(*, features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                           training_boundaries: Sequence[int], dtype: str,
                           engine_name: str, engine_convention: str | None,
                           config_ids: Sequence[int], draft: str,
                           prompts: Sequence[Sequence[int]], check: str,
                           noise: Sequence[TargetFeatures] | None = None) -> Diagnosis:
    """The engine handed the draft, slot by slot and token by token, what training used.

    fp32: every token within the strict bound. Reduced precision: no token may be what a
    wiring bug leaves (another golden state, zeros, a state no nearer its boundary than zero),
    and no slot's median error may exceed the noise floor; `noise` (required there) holds per
    prompt the features of the reference computation in the engine's dtype on its device
    (`Oracle.reference_features`). Tokens precision makes ambiguous pass and are reported in
    the returned diagnosis' details["precision"]."""
    assert_finite("the aux features the engine handed the draft", features)
    hidden = golden[0].boundaries.shape[-1]
    expected_width = len(training_boundaries) * hidden
    widths = {int(x.shape[-1]) for x in features}
    tol = tolerance_for(dtype)
    diag = diagnose_capture(features, golden, training_boundaries, engine_convention=engine_convention,
                            config_ids=config_ids, rtol=tol.rtol, separation=tol.separation)
    if widths != {expected_width}:
        fail(f"the engine handed the draft {sorted(widths)}-wide features, training fed fc "
             f"{expected_width} = {len(training_boundaries)} aux states x {hidden}; "
             f"{diag.message}", draft=draft, engine_name=engine_name, prompts=prompts,
             diagnoses=[diag], check=check)
    bound = tolerance_text(dtype, golden[0].num_layers)
    if tol.strict:
        off, total, worst = _strict_off_tokens(features, golden, training_boundaries, tol.rtol)
        if off:
            fail(f"aux features differ from training on {off}/{total} tokens (worst relative "
                 f"error {worst:.3g}; tolerance: {bound}). {diag.message}", draft=draft,
                 engine_name=engine_name, prompts=prompts, diagnoses=[diag], check=check)
        return diag
    if noise is None:
        raise ValueError(f"judging {dtype} capture needs the {dtype} reference's features of the "
                         f"same prompts (Oracle.reference_features); pass noise=")
    found = classify_capture(features, golden, training_boundaries, noise,
                             noise_factor=tol.noise_factor, separation=tol.separation,
                             floor=tolerance_for("float32").rtol)
    diag.details["precision"] = found.summary()
    if found.ok:
        # the judgement decides: tokens precision leaves undecided are ambiguous, not skipped
        return replace(diag, kind="ok", message=(
            f"all {len(training_boundaries)} slots are the training boundaries "
            f"{list(training_boundaries)} at {dtype}: {found.counts['exact']}/{found.tokens} "
            f"slot-tokens within the noise floor, {found.counts['precision_outlier']} precision "
            f"outliers identified as their own boundary, {found.counts['ambiguous']} ambiguous "
            f"(the {dtype} reference itself cannot be told apart there)."))
    if diag.kind == "ok":
        diag = replace(diag, kind="unknown", message=(
            "every slot is nearest its training boundary, yet some slot's typical error exceeds "
            f"the {dtype} noise floor: no single known cause (a wrong norm, scale or dtype cast "
            "moves every token a little)."))
    if not found.ok:
        shown = "; ".join(f"prompt {p} slot {s} token {t}: {why}" for p, s, t, why in found.wrong[:3])
        drift = "; ".join(f"slot {s} median error {m:.3g} > {a:.3g}" for s, m, a in found.drift)
        fail(f"aux features are not the training boundaries on {len(found.wrong)}/{found.tokens} "
             f"slot-tokens" + (f" ({shown})" if shown else "")
             + (f"; drifting beyond the {dtype} noise floor: {drift}" if drift else "")
             + f" ({found.counts['ambiguous']} more ambiguous at {dtype}, "
             f"{found.counts['precision_outlier']} precision outliers identified as their own "
             f"boundary; tolerance: {bound}). {diag.message}",
             draft=draft, engine_name=engine_name, prompts=prompts, diagnoses=[diag], check=check)
    return diag


def assert_capture_matches_oracle(*, features: Sequence[torch.Tensor], oracle,
                                  prompts: Sequence[Sequence[int]], dtype: str, device: str,
                                  **judged) -> Diagnosis:
    """assert_capture_matches with the golden features of `prompts` from `oracle`
    (harness.golden.oracle.Oracle) and, in reduced precision, the noise floor: the same
    reference computed in the engine's dtype on its device; `judged`: the rest of
    assert_capture_matches' arguments."""
    return assert_capture_matches(
        features=features, golden=[oracle.features(p) for p in prompts], dtype=dtype,
        prompts=prompts, noise=[oracle.reference_features(p, dtype, device) for p in prompts]
        if not tolerance_for(dtype).strict else None, **judged)


def worst_tokens(features: Sequence[torch.Tensor], golden: Sequence[torch.Tensor],
                 rtol: float, allowances: Sequence[torch.Tensor] | None = None) -> tuple[int, int, float]:
    """(bad tokens, total tokens, worst relative error): judged per token, because a bug that
    touches a few positions (a rollback, a ragged batch) vanishes in a whole-prompt norm.
    allowances: per prompt a [T] bound (reduced precision's noise allowance) instead of rtol."""
    bad = total = 0
    worst = 0.0
    for i, (x, ref) in enumerate(zip(features, golden, strict=True)):
        err = relative_errors(x, ref)
        bad += int((err > (rtol if allowances is None else allowances[i])).sum())
        total += err.numel()
        worst = max(worst, float(err.max())) if err.numel() else worst
    return bad, total, worst


@dataclass(frozen=True)
class FcVerdict:
    """The fc check's finding, shared by the fc suite and the acceptance explainer so that
    both judge the projection by one criterion."""

    bad: int
    total: int
    worst: float
    message: str
    diagnosis: Diagnosis | None  # None exactly when ok

    @property
    def ok(self) -> bool:
        return self.bad == 0


def fc_allowances(expected: Sequence[torch.Tensor], same_dtype: Sequence[torch.Tensor],
                  dtype: str) -> list[torch.Tensor] | None:
    """Per prompt, the per-token bound on the engine's fc output in `dtype`: the noise
    allowance of the same-dtype reference fc on the same features; None in fp32 (strict)."""
    tol = tolerance_for(dtype)
    if tol.strict:
        return None
    floor = tolerance_for("float32").rtol
    return [noise_allowance(relative_errors(low, ref), noise_factor=tol.noise_factor, floor=floor)
            for low, ref in zip(same_dtype, expected, strict=True)]


def judge_fc(fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
             expected: Sequence[torch.Tensor], rtol: float, *, draft_hidden: int,
             norm_before_fc: bool, fc_norm: bool,
             allowances: Sequence[torch.Tensor] | None = None) -> FcVerdict:
    """Did the engine's fc output equal fc(the engine's own features), token by token? Judged
    on the engine's features so that a capture bug does not masquerade as an fc bug. In
    reduced precision `allowances` (fc_allowances) replaces rtol."""
    bad, total, worst = worst_tokens(fc_out, expected, rtol, allowances)
    if not bad:
        return FcVerdict(0, total, worst, "fc output matches fc(features)", None)
    bound = f"{rtol:g}" if allowances is None else "twice the same-dtype reference fc's error"
    detail = (f"the draft's fc output differs from fc(features) on {bad}/{total} tokens "
              f"(worst relative error {worst:.3g}, tolerance {bound})")
    diag = diagnose_fc(fc_out, features, detail, rtol, draft_hidden=draft_hidden,
                       norm_before_fc=norm_before_fc, fc_norm=fc_norm)
    return FcVerdict(bad, total, worst, diag.message, diag)


def assert_fc_matches(*, fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
                      expected: Sequence[torch.Tensor], dtype: str, draft_hidden: int,
                      norm_before_fc: bool, fc_norm: bool, engine_name: str, draft: str,
                      prompts: Sequence[Sequence[int]],
                      same_dtype: Sequence[torch.Tensor] | None = None) -> None:
    """The engine's fc output is the trained fc of its own features, token by token;
    same_dtype (required in reduced precision): the reference fc of the same features in the
    engine's dtype on its device (Oracle.reference_fc)."""
    if same_dtype is None and not tolerance_for(dtype).strict:
        raise ValueError(f"judging {dtype} fc needs the {dtype} reference fc (Oracle.reference_fc)")
    verdict = judge_fc(fc_out, features, expected, tolerance_for(dtype).rtol,
                       draft_hidden=draft_hidden, norm_before_fc=norm_before_fc, fc_norm=fc_norm,
                       allowances=None if same_dtype is None else fc_allowances(expected, same_dtype, dtype))
    if not verdict.ok:
        fail(verdict.message, draft=draft, engine_name=engine_name, prompts=prompts,
             diagnoses=[d for d in (verdict.diagnosis,) if d is not None])


def batch_leaks(inside: torch.Tensor, alone: torch.Tensor, *, dtype: str,
                golden: TargetFeatures | None = None,
                noise: TargetFeatures | None = None) -> tuple[int, int, float, str]:
    """(tokens that leak, tokens, worst relative error, the bound in words) for one prompt's
    features inside a batch against alone. fp32: any token beyond rtol leaks. Reduced
    precision: two runs of one engine may each round their own way, so a token leaks only
    where it differs beyond the noise allowance of its slot (the same-dtype reference's error,
    `noise`) AND is then what a wiring bug leaves, judged against the boundary the slot holds
    alone (its modal nearest boundary: batch invariance asks for the same state, whether or
    not it is the one training used, which is the capture check's question)."""
    tol = tolerance_for(dtype)
    if tol.strict or golden is None or noise is None:
        bad, total, worst = worst_tokens([inside], [alone], tol.rtol)
        return bad, total, worst, f"{tol.rtol:g}"
    hidden = golden.boundaries.shape[-1]
    floor = tolerance_for("float32").rtol
    leak = torch.zeros(inside.shape[0], dtype=torch.bool)
    worst = 0.0
    for s in range(inside.shape[-1] // hidden):
        x, y = inside[:, s * hidden:(s + 1) * hidden], alone[:, s * hidden:(s + 1) * hidden]
        b = int(relative_errors(y[None], golden.boundaries).argmin(dim=0).mode().values)
        err = relative_errors(x, y)
        worst = max(worst, float(err.max()))
        tc = classify_tokens(x.float(), golden, b, noise.boundaries[b], noise_factor=tol.noise_factor,
                             separation=tol.separation, floor=floor)
        own = relative_errors(noise.boundaries[b], golden.boundaries[b])
        beyond = err > noise_allowance(own, noise_factor=tol.noise_factor, floor=floor)
        leak |= beyond & torch.tensor([c == WRONG for c in tc.classes])
    return int(leak.sum()), inside.shape[0], worst, tolerance_text(dtype, golden.num_layers)


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
    the rounding of the logits themselves (harness.tolerances.REASONS['near_tie'])."""
    tol = tolerance_for(dtype)
    logits, _ = oracle.top2_logits(context)
    idx = torch.tensor(list(pair))
    gap = float((logits[idx[0]] - logits[idx[1]]).abs())
    bound = tol.near_tie
    if not tol.strict:
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


def assert_speedup_consistent(finding: SpeedupFinding, *, engine_name: str, draft: str,
                              prompts: Sequence[Sequence[int]], check: str) -> None:
    """Speculation delivers the speedup its measured acceptance and per-step costs promise
    (harness.throughput.judge_speedup decides the numbers; this words and raises)."""
    if finding.failure is None:
        return
    diag = throughput_diagnosis(finding.failure, finding.dominant,
                                measured_speedup=finding.measured,
                                predicted_speedup=finding.predicted,
                                acceptance_length=finding.acceptance_length,
                                dominant_share=finding.dominant_share)
    fail(diag.message, draft=draft, engine_name=engine_name, prompts=prompts, diagnoses=[diag],
         check=check)


def assert_convention_as_declared(declared: str, layout: str, observations: Sequence,
                                  diagnoses: Sequence[Diagnosis] = ()) -> None:
    """The engine read every id list served in `layout` the way the convention it declares (or,
    for an engine that honours training, the convention it was told) says. `observations`:
    harness.observed_convention.Observation; `diagnoses`: the capture diagnoses of the lists
    that differed from that prediction."""
    from harness.observed_convention import disagreements, infer_layout

    wrong = disagreements(declared, observations)
    if wrong:
        seen = infer_layout(observations)
        raise ConformanceFailure(
            f"{layout} configs: the engine does not apply the layer-id rule {declared} states "
            f"on {len(wrong)} of {len(observations)} list(s): {'; '.join(wrong)}. Observed rule: "
            f"{seen['rule']}, slots in {seen['slot_order']}. " + " ".join(
                d.message for d in diagnoses if d.kind != "ok")[:2000], list(diagnoses))


def assert_fix_holds(result: str, holds: bool, diagnoses: Sequence[Diagnosis] = ()) -> None:
    """A suggested id list, re-served, made the engine capture the training boundaries (or a
    "no id list fixes this" claim survived the literal ids); `result` words it either way
    (harness.observed_convention.fix_result)."""
    if not holds:
        raise ConformanceFailure(result, list(diagnoses))


def assert_canary_accepts(measured: float, canary: dict, *, engine_name: str, draft: str,
                          prompts: Sequence[Sequence[int]]) -> None:
    """The canary: served on the bundle's canary prompts, the engine's mean acceptance length
    (its own counters, nothing else) reaches the line the bundle drew between serving as
    trained and the best wrong wiring it measured there (`harness.tolerances.CANARY_REASON`)."""
    line = float(canary["threshold"])
    if measured >= line:
        return
    fail(f"canary: mean acceptance length {measured:.3f} on the {len(prompts)} canary prompts is "
         f"below the line {line:.3f}: training's wiring serves {float(canary['served']):.3f} there, "
         f"the best wrong wiring the bundle measured ({canary['best_wrong_wiring']}) "
         f"{float(canary['best_wrong']):.3f}. The engine feeds the draft other states than it "
         f"was trained on (or drafts from them wrongly); run the capture checks where the engine "
         f"exposes its aux states, or `eagle3-conformance doctor`, to name the wiring",
         draft=draft, engine_name=engine_name, prompts=prompts)
