"""A check's status and message from pytest's reports of its phases: passed, failed, error,
skipped (with its stated reason), xfail and xpass, the strict-xfail "now passes" wording.
"""

from __future__ import annotations

import pytest


def root_failure(value: BaseException) -> tuple[BaseException, bool]:
    """(the failure to report, whether Hypothesis called it flaky). A check that failed once
    and passed when Hypothesis replayed the same input raises FlakyFailure, a group around
    the real failures: the report shows the first of those (with its diagnoses), not the
    group, and says the engine is not reproducible."""
    flaky = type(value).__name__ in ("FlakyFailure", "Flaky") and hasattr(value, "exceptions")
    if not flaky:
        return value, False
    inner = list(value.exceptions)
    while inner:
        first = inner.pop(0)
        if hasattr(first, "exceptions"):
            inner = list(first.exceptions) + inner
            continue
        return first, True
    return value, True


FLAKY = ("not reproducible: this input failed, then passed when Hypothesis replayed it, so the "
         "engine's result depends on what it served before (state kept between requests, or "
         "nondeterminism); the first failure was: ")


def exception_message(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    value, flaky = root_failure(excinfo.value)
    if flaky:
        return FLAKY + (str(value).strip() or type(value).__name__)
    text = str(value).strip()
    if isinstance(value, (AssertionError, pytest.fail.Exception)) and text:
        return text
    return excinfo.exconly().strip()


def skip_reason(rep: pytest.TestReport) -> str:
    if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        reason = str(rep.longrepr[2]).removeprefix("Skipped: ").strip()
    else:
        reason = str(rep.longrepr or "").strip()
    return reason or "(skipped without a reason: the check must state one)"


def check_outcome(rep: pytest.TestReport, message: str, listed: str | None) -> tuple[str, str] | None:
    """(status, message) of one phase; None for a setup or teardown that passed."""
    xfail_reason = getattr(rep, "wasxfail", None)
    if rep.passed:
        if rep.when != "call":
            return None
        if xfail_reason is not None:
            return "xpass", f"passed although marked xfail: {xfail_reason}"
        return "passed", ""
    if rep.skipped:
        if xfail_reason is not None:
            return "xfail", message or xfail_reason
        return "skipped", skip_reason(rep)
    if rep.when != "call":
        return "error", f"{rep.when} error: {message or rep.longreprtext.strip()}"
    if isinstance(rep.longrepr, str) and rep.longrepr.startswith("[XPASS(strict)]"):
        return "failed", (f"XPASS(strict): this check now passes but is listed as a known "
                          f"nonconformance ({listed}); the engine was fixed: remove the line")
    return "failed", message or rep.longreprtext.strip()
