"""Every numeric bound the suite judges an engine by, per dtype, in one table with its reason.

A check compares an engine computing in some dtype against the fp32 training reference. How
far apart the two may legitimately be depends on the dtype and on nothing else, so each bound
is looked up here by dtype and a dtype without a row is an error (never a silent fallback:
a default bound is a bound nobody derived). The reasons are in `REASONS`, next to the numbers,
and `tolerance_text` words the capture bounds for failure messages.

Imports nothing (not even torch): the pytest plugin reads `DTYPES` for its option choices
before any test asks for torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class UnknownDtypeError(ValueError):
    """A dtype the suite has no derived bounds for; one line naming the known ones."""


@dataclass(frozen=True)
class Tolerance:
    """The bounds for one engine dtype; each field's reason is `REASONS[field]`."""

    rtol: float  # per-token relative L2 error of a state (capture, fc, batch invariance)
    outlier_budget: float  # share of tokens per slot allowed beyond rtol
    routing_noise: float  # fp32 router margin under which a token's routing is a near-tie
    near_tie: float  # fp32 top-2 logit gap under which a flipped greedy token is excused
    trace: float  # relative gap of mean acceptance length to the golden simulated trace
    prediction_margin: float  # how far held-out acceptance may fall below training's prediction


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(rtol=1e-3, outlier_budget=0.0, routing_noise=0.0, near_tie=1e-3,
                         trace=0.02, prediction_margin=0.10),
    "bfloat16": Tolerance(rtol=5e-2, outlier_budget=0.03, routing_noise=1e-2, near_tie=0.25,
                          trace=0.15, prediction_margin=0.20),
    "float16": Tolerance(rtol=2e-2, outlier_budget=0.03, routing_noise=1.25e-3, near_tie=0.1,
                         trace=0.15, prediction_margin=0.20),
}

# The dtypes an engine may be run in: exactly those with derived bounds.
DTYPES: tuple[str, ...] = tuple(TOLERANCES)

REASONS: dict[str, str] = {
    "rtol": (
        "loose enough for an engine computing the whole target in that dtype (fp32: summation "
        "order only), far below the distance between adjacent boundaries (> 0.3 relative on "
        "the tiny target), so a wrong boundary can never pass"),
    "outlier_budget": (
        "bf16/fp16 rounding flips MoE routing near ties at a few tokens (an H200 run: 4-5 of "
        "265 tokens, relative error up to 0.4) while a wiring bug moves whole slots or "
        "positions; fp32 allows none"),
    "routing_noise": (
        "score units of harness.models.target.routing_margins: bf16 hidden states carry ~1% "
        "relative error by the middle layers, which moves sigmoid router scores by up to "
        "~5e-3; the bound is twice that, fp16 has 3 more mantissa bits, fp32 excuses nothing "
        "(an H200 run: prompt [18] routes with margin 1.7e-3 at layer 1 and bf16 flipped it)"),
    "near_tie": (
        "a greedy token may flip only where the fp32 target's best two logits are this close; "
        "bf16 logits of the tiny target move by ~0.1, fp16 by less, fp32 by summation order"),
    "trace": (
        "fp32 engines recompute the same greedy trace (only summation order differs); reduced "
        "precision flips near-ties in target and draft, which moves a few rounds"),
    "prediction_margin": (
        "the prediction from training's per-step accuracy assumes independent steps, so it is "
        "an estimate, not a bound; reduced precision adds its near-tie flips on top"),
}


def dtype_name(dtype: Any) -> str:
    """'bfloat16' for 'bfloat16' and torch.bfloat16 alike (without importing torch)."""
    return str(dtype).removeprefix("torch.")


def tolerance_for(dtype: Any) -> Tolerance:
    """The bounds for `dtype` (a name or a torch.dtype); UnknownDtypeError if none derived."""
    name = dtype_name(dtype)
    try:
        return TOLERANCES[name]
    except KeyError:
        raise UnknownDtypeError(f"no tolerance for dtype {name!r}; use one of "
                                f"{', '.join(DTYPES)}") from None


def rtol_for(dtype: Any) -> float:
    """Per-token relative tolerance of a state for an engine computing in `dtype`."""
    return tolerance_for(dtype).rtol


def tolerance_text(dtype: Any, num_layers: int) -> str:
    """The capture bounds in words, for a failure message."""
    name = dtype_name(dtype)
    tol = tolerance_for(name)
    if tol.outlier_budget == 0 and tol.routing_noise == 0:
        return (f"per-token relative L2 error <= {tol.rtol:g} on every token (fp32 engines "
                f"match the fp32 training reference up to summation order)")
    return (f"per-token relative L2 error <= {tol.rtol:g}; a token whose fp32 router margin "
            f"before that boundary is <= {tol.routing_noise:g} is excused ({name} may flip a "
            f"near-tie routing); of the rest up to {tol.outlier_budget:.0%} of tokens per slot "
            f"beyond it, whole-slot error <= {tol.rtol:g} ({name} rounding through "
            f"{num_layers} layers)")
