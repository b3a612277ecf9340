"""Pass/fail of the draft's fc projection of the aux states, against fc(features) in the
engine's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from harness.core.tolerances import tolerance_for
from harness.diagnosis.draft_side import diagnose_fc
from harness.diagnosis.fingerprint import relative_errors
from harness.diagnosis.identity import noise_allowance
from harness.judgement.assertions.base import worst_tokens
from harness.judgement.precision import allowance_floor, is_reduced
from harness.judgement.verdict import Judgement


def fc_allowances(expected: Sequence[torch.Tensor], same_dtype: Sequence[torch.Tensor],
                  dtype: str) -> list[torch.Tensor] | None:
    """Per prompt, the per-token bound on the engine's fc output in `dtype`: the noise
    allowance of the fc's precision envelope on the same features (`same_dtype`: per prompt
    [M, T, H], the correct implementations' fc, Oracle.reference_fc; or one [T, H]), the
    largest error among them; None in fp32 (strict)."""
    if not is_reduced(dtype):
        return None
    tol = tolerance_for(dtype)
    floor = allowance_floor()

    def envelope_error(low: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        err = relative_errors(low, ref)
        return err.amax(0) if err.dim() == 2 else err

    return [noise_allowance(envelope_error(low, ref), noise_factor=tol.noise_factor, floor=floor)
            for low, ref in zip(same_dtype, expected, strict=True)]


def judge_fc(fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
             expected: Sequence[torch.Tensor], rtol: float, *, draft_hidden: int,
             norm_before_fc: bool, fc_norm: bool,
             allowances: Sequence[torch.Tensor] | None = None) -> Judgement:
    """Did the engine's fc output equal fc(the engine's own features), token by token? Judged
    on the engine's features so that a capture bug does not masquerade as an fc bug. In
    reduced precision `allowances` (fc_allowances) replaces rtol. One criterion for the fc
    check and the acceptance explainer; the diagnosis (harness.diagnosis.draft_side) only on a
    mismatch. The judgement names no draft or engine: `assert_fc_matches` adds them."""
    bad, total, worst = worst_tokens(fc_out, expected, rtol, allowances)
    bound = f"{rtol:g}" if allowances is None else "twice the fc precision envelope's error"
    measured = {"tokens_off": bad, "tokens": total, "worst_rel_error": worst}
    if not bad:
        return Judgement(True, "fc output matches fc(features)", measured=measured, bound=bound)
    detail = (f"the draft's fc output differs from fc(features) on {bad}/{total} tokens "
              f"(worst relative error {worst:.3g}, tolerance {bound})")
    diag = diagnose_fc(fc_out, features, detail, rtol, draft_hidden=draft_hidden,
                       norm_before_fc=norm_before_fc, fc_norm=fc_norm)
    return Judgement(False, diag.message, measured=measured, bound=bound, diagnosis=diag)


def assert_fc_matches(*, fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
                      expected: Sequence[torch.Tensor], dtype: str, draft_hidden: int,
                      norm_before_fc: bool, fc_norm: bool, engine_name: str, draft: str,
                      prompts: Sequence[Sequence[int]],
                      same_dtype: Sequence[torch.Tensor] | None = None) -> None:
    """The engine's fc output is the trained fc of its own features, token by token;
    same_dtype (required in reduced precision): per prompt, the fc of the same features by the
    correct implementations in the engine's dtype (Oracle.reference_fc), its envelope."""
    if same_dtype is None and is_reduced(dtype):
        raise ValueError(f"judging {dtype} fc needs the {dtype} reference fc (Oracle.reference_fc)")
    judged = judge_fc(fc_out, features, expected, tolerance_for(dtype).rtol,
                      draft_hidden=draft_hidden, norm_before_fc=norm_before_fc, fc_norm=fc_norm,
                      allowances=None if same_dtype is None else fc_allowances(expected, same_dtype, dtype))
    replace(judged, draft=draft, engine_name=engine_name, prompts=prompts).verdict()
