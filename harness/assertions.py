"""Assertion helpers whose failure text explains: what was compared, the tolerance and why,
what the engine did instead (the diagnosis), and a minimal reproducer.

A check calls one of these and nothing else decides pass/fail, so every check words its
failures the same way and every failure carries a diagnosis into report.json.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from harness.diagnose import (
    Diagnosis,
    diagnose_capture,
    nearest_labels,
    outlier_budget_for,
    relative_errors,
    routing_noise_for,
    rtol_for,
    worst_tokens,
)
from harness.engines.base import Capability, Engine
from harness.golden.features import TargetFeatures
from harness.report import ConformanceFailure

__all__ = ["ConformanceFailure", "assert_capture_matches", "assert_capture_matches_oracle",
           "assert_convention_as_declared", "assert_fix_holds", "divergence", "require",
           "worst_tokens"]


def require(engine: Engine, capability: Capability) -> None:
    """Skip, with the reason printed, what this engine cannot do."""
    if capability not in engine.capabilities:
        pytest.skip(f"{engine.name} does not declare the {capability.value!r} capability")


def tolerance_text(dtype: str) -> str:
    rtol, budget, noise = rtol_for(dtype), outlier_budget_for(dtype), routing_noise_for(dtype)
    if dtype == "float32":
        return (f"per-token relative L2 error <= {rtol:g} on every token (fp32 engines match the "
                f"fp32 training reference up to summation order)")
    return (f"per-token relative L2 error <= {rtol:g}; a token whose fp32 router margin before "
            f"that boundary is <= {noise:g} is excused ({dtype} may flip a near-tie routing); "
            f"of the rest up to {budget:.0%} of tokens per slot beyond it, whole-slot error "
            f"<= {rtol:g} ({dtype} rounding through {{layers}} layers)")


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


def reproducer(engine_name: str, draft: str, prompts: Sequence[Sequence[int]], check: str) -> str:
    shown = [list(p) for p in prompts[:3]]
    more = f" (+{len(prompts) - 3} more)" if len(prompts) > 3 else ""
    return (f"reproduce: eagle3-conformance run --engine {engine_name} --draft {draft} -k {check}"
            f"  # prompts {shown}{more}")


def assert_capture_matches(*, features: Sequence[torch.Tensor], golden: Sequence[TargetFeatures],
                           training_boundaries: Sequence[int], dtype: str,
                           engine_name: str, engine_convention: str | None,
                           config_ids: Sequence[int], draft: str,
                           prompts: Sequence[Sequence[int]], check: str,
                           margins: Sequence[torch.Tensor] | None = None) -> Diagnosis:
    """The engine handed the draft, slot by slot and token by token, what training used.
    `margins`: per prompt, the oracle's fp32 routing margins [N+1, T]; without them no token
    is excused as a routing near-tie."""
    hidden = golden[0].boundaries.shape[-1]
    expected_width = len(training_boundaries) * hidden
    widths = {int(x.shape[-1]) for x in features}
    rtol = rtol_for(dtype)
    diag = diagnose_capture(features, golden, training_boundaries, engine_convention=engine_convention,
                            config_ids=config_ids, rtol=rtol, outlier_budget=outlier_budget_for(dtype))
    if widths != {expected_width}:
        raise ConformanceFailure(
            f"the engine handed the draft {sorted(widths)}-wide features, training fed fc "
            f"{expected_width} = {len(training_boundaries)} aux states x {hidden}; "
            f"{diag.message}\n{reproducer(engine_name, draft, prompts, check)}", [diag])
    off, excused, total, worst = _off_tokens(features, golden, training_boundaries, rtol, margins,
                                             routing_noise_for(dtype))
    unexcused = off - excused
    if unexcused and diag.kind != "ok" or unexcused > outlier_budget_for(dtype) * total:
        tol = tolerance_text(dtype).format(layers=golden[0].num_layers)
        raise ConformanceFailure(
            f"aux features differ from training on {unexcused}/{total} tokens"
            + (f" ({excused} more excused as routing near-ties)" if excused else "")
            + f" (worst relative error {worst:.3g}; tolerance: {tol}). {diag.message}\n"
            f"{reproducer(engine_name, draft, prompts, check)}", [diag])
    return diag


def assert_capture_matches_oracle(*, features: Sequence[torch.Tensor], oracle,
                                  prompts: Sequence[Sequence[int]], dtype: str,
                                  **judged) -> Diagnosis:
    """assert_capture_matches with the golden features and (reduced precision only) routing
    margins of `prompts` from `oracle` (harness.golden.oracle.Oracle); `judged`: the rest of
    assert_capture_matches' arguments."""
    return assert_capture_matches(
        features=features, golden=[oracle.features(p) for p in prompts], dtype=dtype,
        prompts=prompts, margins=[oracle.routing_margins(p) for p in prompts]
        if dtype != "float32" else None, **judged)


# fp32 logit gap a near-tie must fall within to excuse a flipped greedy token, per dtype.
NEAR_TIE = {"float32": 1e-3, "float16": 0.1, "bfloat16": 0.25}


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
    noise = NEAR_TIE.get(dtype, 0.25)
    margin = oracle.top2_margin(list(prompt) + list(want[:j]))
    if margin <= noise:
        return True, None
    return False, (f"prompt {list(prompt)}: token {j} is {got[j]} vs {want[j]} (fp32 top-2 margin "
                   f"{margin:.3g} > near-tie noise {noise:g} for {dtype})")


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
