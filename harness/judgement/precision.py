"""The one place that tells an fp32 engine from a reduced-precision one.

An fp32 engine is judged strictly: it must match the fp32 training reference up to summation
order on every token, and its greedy trace round by round. A bf16 or fp16 engine is judged
against what correct implementations in its dtype do (the precision envelope,
harness/golden/envelope.py; the same-dtype reference engine's acceptance), because precision
noise crosses any fixed per-token bound at depth (docs/DESIGN.md, "Tolerances"). Every check
needs that branch; it used to be spelled out at each of them (`tolerance_for(dtype).strict`,
`dtype != "float32"`), so a new check could take it one way and its neighbour the other. Here
it is taken once, by small functions that say what each side needs: whether the dtype is
reduced, and the same-dtype evidence (envelopes, the fc's envelope, the reference engine's own
acceptance) that exists only there.

The numbers themselves stay in `harness.core.tolerances` (one row per dtype); this module only
decides which of them a judgement uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from harness.core.tolerances import tolerance_for

if TYPE_CHECKING:
    import torch

    from harness.golden.envelope import Envelope
    from harness.golden.features import TargetFeatures
    from harness.golden.oracle import Oracle


def is_reduced(dtype: Any) -> bool:
    """True for a dtype judged against correct implementations in that dtype (bf16, fp16);
    False for fp32, judged strictly. An unknown dtype raises (tolerance_for): no default."""
    return not tolerance_for(dtype).strict


def traces_exact(dtype: Any) -> bool:
    """Whether per-round acceptance must equal training's round by round: only in fp32, where
    the greedy chain is one computation; reduced precision flips near-ties in a few rounds."""
    return not is_reduced(dtype)


def allowance_floor() -> float:
    """The least per-token allowance a reduced-precision judgement gives (the fp32 bound): where
    every member of an envelope happens to round exactly, an engine may still differ by
    summation order."""
    return tolerance_for("float32").rtol


def envelopes(oracle: Oracle, prompts: Sequence[Sequence[int]], dtype: str,
              lengths: Sequence[int] | None = None) -> list[Envelope] | None:
    """Per prompt its precision envelope in `dtype` (Oracle.envelope; `lengths`: each cut to
    its first that many tokens), what the reduced-precision capture judgement needs; None in
    fp32, which has no envelope."""
    if not is_reduced(dtype):
        return None
    found = [oracle.envelope(p, dtype) for p in prompts]
    return found if lengths is None else [e.prefix(n) for e, n in zip(found, lengths, strict=True)]


def leak_evidence(oracle: Oracle, prompt: Sequence[int], dtype: str
                  ) -> tuple[TargetFeatures | None, Envelope | None]:
    """(golden features, precision envelope) of `prompt` for `batch_leaks` in reduced precision,
    where two runs of one engine may each round their own way; (None, None) in fp32, where any
    token beyond rtol leaks."""
    if not is_reduced(dtype):
        return None, None
    return oracle.features(prompt), oracle.envelope(prompt, dtype)


def reference_fc(oracle: Oracle, draft: str, features: Sequence[torch.Tensor], dtype: str,
                 without: str | None = None) -> list[torch.Tensor] | None:
    """Per prompt the fc of the engine's own features by the correct implementations in
    `dtype` (Oracle.reference_fc: the fc's precision envelope; `without`: a member left out);
    None in fp32, where fc is judged within rtol."""
    if not is_reduced(dtype):
        return None
    return [oracle.reference_fc(draft, f, dtype, without=without) for f in features]


def same_dtype_acceptance(dtype: str, measure: Callable[[], float]) -> float | None:
    """The reference engine's own acceptance in the engine's dtype (`measure`: what runs it,
    seconds of generation) where precision may move acceptance; None in fp32, where training's
    is the line."""
    return measure() if is_reduced(dtype) else None


def trace_allowance(golden: float, gap: float, dtype: str,
                    same_dtype: Callable[[], float]) -> tuple[float, float | None]:
    """(the gap allowed between an engine's mean acceptance length and the golden trace's
    `golden`, the same-dtype reference's acceptance where it was measured): the dtype's
    relative `trace` bound, plus in reduced precision, and only where `gap` exceeds that,
    noise_factor times what the dtype moves the reference's own trace (`same_dtype`, measured
    only then: a generation run; harness.core.tolerances.REASONS['trace'])."""
    tol = tolerance_for(dtype)
    allowed = tol.trace * golden
    if gap <= allowed or not is_reduced(dtype):
        return allowed, None
    own = same_dtype()
    return allowed + tol.noise_factor * abs(own - golden), own
