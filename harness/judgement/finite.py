"""Non-finite values (NaN, +-Inf): found before anything is compared, and named.

Every comparison of the suite counts a token as bad when its error exceeds a tolerance, and
`NaN > rtol` is False: an engine handing the draft only NaN would pass every check. So the
error measure maps a non-finite error to +inf (`harness.diagnosis.fingerprint.relative_errors`), and the
checks call `assert_finite` (or, inside a judge function, `finite_judgement`) on what the engine
returned before judging it, so that the
failure says "NaN" instead of "unknown boundary". The golden data and the draft weights are
checked at bundle load (`harness.golden.bundle`), and the draft lint checks a user's draft.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from harness.diagnosis.record import Diagnosis
from harness.judgement.verdict import Judgement

NON_FINITE = "non_finite"

_CAUSE = ("non-finite values — the engine handed over NaN or Inf, which no training state "
          "holds: an unwritten buffer (torch.empty), an overflow in reduced precision, or "
          "weights loaded as garbage. Fix in the engine; the tolerances cannot judge NaN, so "
          "this fails every comparison.")


def non_finite_count(tensors: Iterable[torch.Tensor]) -> tuple[int, int, int]:
    """(NaN values, Inf values, all values) over the tensors."""
    nan = inf = total = 0
    for t in tensors:
        if not t.is_floating_point():
            total += t.numel()
            continue
        nan += int(torch.isnan(t).sum())
        inf += int(torch.isinf(t).sum())
        total += t.numel()
    return nan, inf, total


def describe_non_finite(tensors: Iterable[torch.Tensor]) -> str | None:
    """"3 NaN and 0 Inf of 512 values", or None when every value is finite."""
    nan, inf, total = non_finite_count(tensors)
    if not nan and not inf:
        return None
    return f"{nan} NaN and {inf} Inf of {total} values"


def non_finite_diagnosis(what: str, detail: str) -> Diagnosis:
    return Diagnosis(kind=NON_FINITE, message=f"NaN/Inf in {what}: {detail}; root cause: {_CAUSE}",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None,
                     details={"what": what, "count": detail})


def finite_judgement(what: str, tensors: Iterable[torch.Tensor] | None) -> Judgement | None:
    """The failed judgement, with a `non_finite` diagnosis, where any value the engine returned
    is NaN or Inf (None where all are finite): no comparison follows, so it carries no
    reproducer of its own. `what` names it ("the aux features the engine handed the draft")."""
    if tensors is None:
        return None
    detail = describe_non_finite(list(tensors))
    if detail is None:
        return None
    diag = non_finite_diagnosis(what, detail)
    return Judgement(False, diag.message, measured=detail, bound="every value finite",
                     diagnosis=diag, reproduce=False)


def assert_finite(what: str, tensors: Iterable[torch.Tensor] | None) -> None:
    """Fail the check if any value the engine returned is NaN or Inf (`finite_judgement`)."""
    judged = finite_judgement(what, tensors)
    if judged is not None:
        judged.verdict()
