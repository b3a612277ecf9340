"""Assertion helpers whose failure text explains: what was compared, the tolerance and why,
what the engine did instead (the diagnosis), and a minimal reproducer.

A check calls one of these and nothing else decides pass/fail: every check fails through
`fail` (or a helper built on it), so every failure is worded the same way, ends with the
command that reproduces it and carries its diagnoses into report.json. Tolerances come from
`harness.tolerances`; the wording of causes from `harness.diagnosis`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import pytest
import torch

from harness.diagnosis.capture import diagnose_capture
from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.draft_side import diagnose_fc
from harness.diagnosis.fingerprint import nearest_labels, relative_errors
from harness.diagnosis.record import Diagnosis
from harness.diagnosis.throughput import throughput_diagnosis
from harness.engines.base import Capability, Engine
from harness.golden.features import TargetFeatures
from harness.report import ConformanceFailure
from harness.throughput import SpeedupFinding
from harness.tolerances import tolerance_for, tolerance_text

__all__ = ["ConformanceFailure", "FcVerdict", "assert_capture_matches", "assert_fc_matches",
           "assert_speedup_consistent", "crash_failure", "divergence", "fail", "failure", "judge_fc",
           "require", "worst_tokens"]


def require(engine: Engine, capability: Capability) -> None:
    """Skip, with the reason printed, what this engine cannot do."""
    if capability not in engine.capabilities:
        pytest.skip(f"{engine.name} does not declare the {capability.value!r} capability")


def _off_tokens(features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                training_boundaries: Sequence[int], rtol: float,
                margins: Sequence[torch.Tensor] | None, noise: float) -> tuple[int, int, int, float]:
    """(tokens off, of them excused, tokens, worst relative error), judged slot by slot so a
    slot of small norm cannot hide inside the concatenation.

    A token off in some slot is excused when reduced precision explains it in every slot
    where it is off: fp32 routing is a near-tie before that boundary at this token or an
    earlier one (an expert swapped there, felt here through attention), and the engine's
    state is still nearer to the trained boundary than to any other golden state. A wiring
    bug hands over another boundary (nearest: that one), so it is never excused."""
    hidden = golden[0].boundaries.shape[-1]
    off_total = excused = tokens = 0
    worst = 0.0
    for p, (x, g) in enumerate(zip(features, golden, strict=True)):
        off = torch.zeros(x.shape[0], dtype=torch.bool)
        explained = torch.ones(x.shape[0], dtype=torch.bool)
        for s, b in enumerate(training_boundaries):
            chunk = x[:, s * hidden:(s + 1) * hidden]
            err = relative_errors(chunk, g.boundaries[b])
            worst = max(worst, float(err.max())) if err.numel() else worst
            bad = err > rtol
            if not bad.any():
                continue
            off |= bad
            if margins is None or noise <= 0:
                explained[:] = False
                continue
            tie_so_far = torch.cummax((margins[p][b] <= noise).int(), dim=0).values.bool()
            recognisable = torch.tensor([label == b for label in nearest_labels(chunk, g)])
            explained &= ~bad | (tie_so_far & recognisable)
        off_total += int(off.sum())
        excused += int((off & explained).sum())
        tokens += x.shape[0]
    return off_total, excused, tokens, worst


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
                           margins: Sequence[torch.Tensor] | None = None,
                           alone: Callable[[], Sequence[torch.Tensor]] | None = None,
                           context: Callable[[], tuple[Sequence[torch.Tensor], Sequence[TargetFeatures]]]
                           | None = None) -> Diagnosis:
    """The engine handed the draft, slot by slot and token by token, what training used.
    `margins`: per prompt, the oracle's fp32 routing margins [N+1, T]; without them no token
    is excused as a routing near-tie. `alone`: the engine's features of each prompt captured
    on its own, asked for only when the batch differs from training (the evidence that tells a
    batch-dependent capture from every other cause). `context`: the engine's features and the
    golden features of more prompts, asked for only on a mismatch, so that a shrunk
    one-token example is diagnosed with enough evidence (a lone zero row fits many causes)."""
    hidden = golden[0].boundaries.shape[-1]
    expected_width = len(training_boundaries) * hidden
    widths = {int(x.shape[-1]) for x in features}
    tol = tolerance_for(dtype)
    rtol = tol.rtol
    diag = diagnose_capture(features, golden, training_boundaries, engine_convention=engine_convention,
                            config_ids=config_ids, rtol=rtol, outlier_budget=tol.outlier_budget)
    if diag.kind != "ok" and context is not None:
        more, more_golden = context()
        diag = diagnose_capture([*features, *more], [*golden, *more_golden], training_boundaries,
                                engine_convention=engine_convention, config_ids=config_ids,
                                rtol=rtol, outlier_budget=tol.outlier_budget)
    if diag.kind != "ok" and alone is not None and len(features) > 1:
        diag = diagnose_capture(features, golden, training_boundaries,
                                engine_convention=engine_convention, config_ids=config_ids,
                                rtol=rtol, outlier_budget=tol.outlier_budget, alone=alone())
    if widths != {expected_width}:
        fail(f"the engine handed the draft {sorted(widths)}-wide features, training fed fc "
             f"{expected_width} = {len(training_boundaries)} aux states x {hidden}; "
             f"{diag.message}", draft=draft, engine_name=engine_name, prompts=prompts,
             diagnoses=[diag], check=check)
    off, excused, total, worst = _off_tokens(features, golden, training_boundaries, rtol, margins,
                                             tol.routing_noise)
    unexcused = off - excused
    if unexcused and diag.kind != "ok" or unexcused > tol.outlier_budget * total:
        fail(f"aux features differ from training on {unexcused}/{total} tokens"
             + (f" ({excused} more excused as routing near-ties)" if excused else "")
             + f" (worst relative error {worst:.3g}; tolerance: "
             f"{tolerance_text(dtype, golden[0].num_layers)}). {diag.message}",
             draft=draft, engine_name=engine_name, prompts=prompts, diagnoses=[diag], check=check)
    return diag


def worst_tokens(features: Sequence[torch.Tensor], golden: Sequence[torch.Tensor],
                 rtol: float) -> tuple[int, int, float]:
    """(bad tokens, total tokens, worst relative error): judged per token, because a bug that
    touches a few positions (a rollback, a ragged batch) vanishes in a whole-prompt norm."""
    bad = total = 0
    worst = 0.0
    for x, ref in zip(features, golden, strict=True):
        err = relative_errors(x, ref)
        bad += int((err > rtol).sum())
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


def judge_fc(fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
             expected: Sequence[torch.Tensor], rtol: float, *, draft_hidden: int,
             norm_before_fc: bool, fc_norm: bool) -> FcVerdict:
    """Did the engine's fc output equal fc(the engine's own features), token by token? Judged
    on the engine's features so that a capture bug does not masquerade as an fc bug."""
    bad, total, worst = worst_tokens(fc_out, expected, rtol)
    if not bad:
        return FcVerdict(0, total, worst, "fc output matches fc(features)", None)
    detail = (f"the draft's fc output differs from fc(features) on {bad}/{total} tokens "
              f"(worst relative error {worst:.3g}, tolerance {rtol:g})")
    diag = diagnose_fc(fc_out, features, detail, rtol, draft_hidden=draft_hidden,
                       norm_before_fc=norm_before_fc, fc_norm=fc_norm)
    return FcVerdict(bad, total, worst, diag.message, diag)


def assert_fc_matches(*, fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
                      expected: Sequence[torch.Tensor], dtype: str, draft_hidden: int,
                      norm_before_fc: bool, fc_norm: bool, engine_name: str, draft: str,
                      prompts: Sequence[Sequence[int]]) -> None:
    """The engine's fc output is the trained fc of its own features, token by token."""
    verdict = judge_fc(fc_out, features, expected, tolerance_for(dtype).rtol,
                       draft_hidden=draft_hidden, norm_before_fc=norm_before_fc, fc_norm=fc_norm)
    if not verdict.ok:
        fail(verdict.message, draft=draft, engine_name=engine_name, prompts=prompts,
             diagnoses=[d for d in (verdict.diagnosis,) if d is not None])


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(oracle, prompt: Sequence[int], got: Sequence[int], want: Sequence[int],
               dtype: str) -> tuple[bool, str | None]:
    """(excused near-tie?, failure text or None) for two greedy continuations of `prompt`."""
    j = first_divergence(got, want)
    if j is None:
        return False, None
    if j >= min(len(got), len(want)):
        return False, f"prompt {list(prompt)}: lengths differ ({len(got)} vs {len(want)} tokens)"
    noise = tolerance_for(dtype).near_tie
    margin = oracle.top2_margin(list(prompt) + list(want[:j]))
    if margin <= noise:
        return True, None
    return False, (f"prompt {list(prompt)}: token {j} is {got[j]} vs {want[j]} (fp32 top-2 margin "
                   f"{margin:.3g} > near-tie noise {noise:g} for {dtype})")


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
