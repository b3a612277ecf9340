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
    """The bounds for one engine dtype; each field's reason is `REASONS[field]`.

    fp32 is judged strictly (`noise_factor == 0`): every token within `rtol` of the fp32
    reference. A reduced dtype is judged by what a wiring bug is, not by a per-token error
    bound that precision noise crosses: each token is identified among the golden states
    (`separation`), and its error is measured against the precision envelope: the largest
    error any of several correct implementations of the training computation makes in that
    dtype (`noise_factor`; harness/golden/envelope.py)."""

    rtol: float  # fp32: per-token bound; reduced: the diagnosis' "matches within tolerance" label
    unit: float  # unit roundoff of the dtype (rounding a logit costs up to unit * |logit|)
    noise_factor: float  # engine error allowed per token, in multiples of the same-dtype reference's
    separation: float  # nearest golden state must be this many times nearer than any other
    near_tie: float  # fp32 top-2 logit gap under which a flipped greedy token is always excused
    trace: float  # relative gap of mean acceptance length to the golden (or same-dtype) trace
    prediction_margin: float  # how far held-out acceptance may fall below training's prediction

    @property
    def strict(self) -> bool:
        """fp32: no noise floor, no identity; every token within rtol."""
        return self.noise_factor == 0


TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(rtol=1e-3, unit=2.0 ** -24, noise_factor=0.0, separation=0.0,
                         near_tie=1e-3, trace=0.02, prediction_margin=0.10),
    "bfloat16": Tolerance(rtol=5e-2, unit=2.0 ** -8, noise_factor=2.0, separation=2.0,
                          near_tie=1e-3, trace=0.02, prediction_margin=0.20),
    "float16": Tolerance(rtol=2e-2, unit=2.0 ** -11, noise_factor=2.0, separation=2.0,
                         near_tie=1e-3, trace=0.02, prediction_margin=0.20),
}

# Where the canary's line sits between the best wrong wiring's acceptance on the canary prompts
# and the acceptance served as trained (`harness.golden.wirings.choose_canary`; reason below).
CANARY_FRACTION = 0.5

CANARY_REASON = (
    "the canary judges an engine by acceptance counters alone, so its line is drawn between "
    "two measurements the bundle makes itself on the canary prompts: the acceptance served "
    "as trained and the highest acceptance any wrong wiring reaches there (manifest "
    "drafts.<name>.wirings and .canary). Half-way (CANARY_FRACTION = 0.5) leaves a correct "
    "engine and the least harmful wrong wiring the same room: precision noise that costs a "
    "correct engine less than half the gap cannot fail it, and a wrong wiring would have to "
    "gain half the gap back to pass (docs/BUNDLE.md: the wiring table and each draft's canary)")

# A slot drifts when most of its judged tokens, and at least this many, lie beyond their own
# allowance (reason below).
DRIFT_MIN_TOKENS = 4

DRIFT_REASON = (
    "drift catches a bug that moves every token a little (a wrong norm weight or epsilon, a "
    "scale, a cast): each token stays clearly its own boundary, so the per-token judgement "
    "passes it as a precision outlier, but a correct engine is beyond its allowance on few "
    "tokens (0.7% of slot-tokens for the widest envelope member judged against the others, "
    "H200 host CPU, bf16) while such a bug is beyond it on nearly all. So a slot drifts when "
    "more than half of its judged tokens are beyond their allowance, over at least 4 tokens: "
    "for a correct engine that is >= 3 outliers of 4 at a per-token rate p, C(4,3) p^3 < 5e-4 "
    "even at p = 0.05. An earlier rule, the slot's median error against twice the envelope's "
    "median, failed 37 of 36000 leave-one-out judgements of correct implementations (and real "
    "vLLM wired right), all on prompts of 1-8 tokens, where a median is a token or two")

# The dtypes an engine may be run in: exactly those with derived bounds.
DTYPES: tuple[str, ...] = tuple(TOLERANCES)

REASONS: dict[str, str] = {
    "rtol": (
        "fp32: loose enough for summation order only, far below the distance between adjacent "
        "boundaries (> 0.3 relative on the tiny target), so a wrong boundary can never pass. "
        "bf16/fp16: no longer a pass/fail bound (precision noise crosses any fixed per-token "
        "bound at depth: 0.21 median at b = 61 of a DeepSeek-V3-shaped target, above the "
        "0.13 between adjacent boundaries there); only the diagnosis' label 'matches within "
        "tolerance', about 10 (bf16) / 80 (fp16) unit roundoffs, the error a handful of "
        "layers of rounding leaves"),
    "unit": (
        "the dtype's unit roundoff 2^-(mantissa bits + 1): rounding a value to the dtype moves "
        "it by at most unit * |value|; bounds the logit noise a near-tie may be flipped by "
        "even where the same-dtype reference happens to round exactly"),
    "noise_factor": (
        "an engine's per-token error is judged against the precision envelope at that token and "
        "slot (and that slot's median, whichever is larger): the largest error any correct "
        "implementation of the training computation in the engine's dtype makes there "
        "(harness/models/variants.py: transformers' kernels, eager attention, three MoE expert "
        "summation orders, RMSNorm accumulated in the dtype, an fp32 residual stream, the "
        "router in the dtype, split-K GEMMs with reduced-precision reduction, all the lossy "
        "choices at once; on the CPU and, where present, the GPU). An engine is one more "
        "correct implementation: its rounding is of the members' size but not their rounding, "
        "and independent errors of equal size differ by up to their sum, so twice the "
        "envelope; beyond it a token must still be identified (separation). A slot drifts when "
        "most of its tokens are beyond that allowance (DRIFT_REASON). The same factor doubles the "
        "members' largest router-score move for a routing near-tie. Never fitted to one "
        "engine: a leave-one-out run (benchmarks/false_alarms.py --leave-one-out) judges each "
        "member against the envelope of the others. fp32 has no envelope: 0 means strict"),
    "separation": (
        "a token is identified as the golden state it is nearest to when every other candidate "
        "(boundary, post-norm state, MLP output without residual) is at least this many times "
        "farther; 2 is what the triangle inequality guarantees a state within a third of the "
        "adjacent-boundary distance of its own boundary (d_own <= D/3 gives d_other >= 2D/3), "
        "and below the min separation 1.96 an H200 bf16 run measured at 61 layers a token is "
        "reported ambiguous, not failed; a token clearly nearer another state (by the same "
        "factor), zero, or no nearer its boundary than zero is (relative error >= 1) is a "
        "wiring bug"),
    "near_tie": (
        "fp32: a greedy token may flip only where the fp32 target's best two logits are this "
        "close (summation order). Reduced precision adds the measured noise of the same-dtype "
        "reference's logits at that position (noise_factor times |d top1| + |d top2|, the most "
        "the gap can move) and the rounding of the logits themselves (2 * unit * |logit|)"),
    "trace": (
        "fp32 engines recompute the same greedy trace (only summation order differs). Reduced "
        "precision flips near-ties in target and draft, which moves a few rounds: the bound "
        "adds noise_factor times the same-dtype reference's own gap to the golden trace"),
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
    if tol.strict:
        return (f"per-token relative L2 error <= {tol.rtol:g} on every token (fp32 engines "
                f"match the fp32 training reference up to summation order)")
    return (f"each token identified as its training boundary: nearest golden state with every "
            f"other candidate >= {tol.separation:g}x farther, error within {tol.noise_factor:g}x "
            f"the {name} reference's own error at that token (same device, {num_layers} layers); "
            f"a wiring bug is a token clearly nearer another state, zero, or no nearer its "
            f"boundary than zero")
