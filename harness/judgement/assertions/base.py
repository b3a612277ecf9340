"""The assertion layer's common ground: a capability requirement, the reproducer every
failure ends with, and `fail`, through which every check fails.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NoReturn

import pytest
import torch

from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.fingerprint import relative_errors
from harness.diagnosis.record import Diagnosis, failing_diagnoses
from harness.engines.base import Capability, Engine
from harness.reports.report import ConformanceFailure


def require(engine: Engine, capability: Capability) -> None:
    """Skip, with the reason printed, what this engine cannot do."""
    if capability not in engine.capabilities:
        pytest.skip(f"{engine.name} does not declare the {capability.value!r} capability")




# The --engine value this run was given, set by the plugin at configure: the reproducer
# repeats it, since an adapter's `name` ("template") is not what --engine takes
# ("examples.template_adapter:TemplateEngine").
_RUN_ENGINE: dict[str, str] = {}


def set_run_engine(value: str | None) -> None:
    """Remember the run's --engine value for the reproducers (None forgets it)."""
    _RUN_ENGINE.pop("value", None)
    if value:
        _RUN_ENGINE["value"] = value


def current_check() -> str:
    """The running check's function name (pytest's PYTEST_CURRENT_TEST, parameters dropped):
    what `-k` selects to rerun it."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.split("::")[-1].split(" ")[0].split("[")[0] or "<check>"


def reproducer(engine_name: str | None, draft: str, prompts: Sequence[Sequence[int]] | None = None,
               check: str | None = None) -> str:
    """The command that reruns one check for one draft (and the prompts it failed on)."""
    engine_name = _RUN_ENGINE.get("value", engine_name)
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
    """A check's failure: `message`, then the reproducer; `diagnoses` go to report.json. A
    diagnosis of kind `ok` on a failure becomes `unrecognised` with this failure's evidence and
    reproducer (`harness.diagnosis.record.unexplained`): a failed check never says "ok"."""
    again = reproducer(engine_name, draft, prompts, check)
    return ConformanceFailure(f"{message}\n{again}", failing_diagnoses(diagnoses, message, again))


def fail(message: str, *, draft: str, engine_name: str | None = None,
         prompts: Sequence[Sequence[int]] | None = None, diagnoses: Sequence[Diagnosis] = (),
         check: str | None = None) -> NoReturn:
    """Fail the running check (see `failure`)."""
    raise failure(message, draft=draft, engine_name=engine_name, prompts=prompts,
                  diagnoses=diagnoses, check=check)


def crash_failure(crash: BaseException, *, layer_ids: Sequence[int], target_hidden: int,
                  engine_name: str, draft: str, **context: Any) -> ConformanceFailure:
    """An engine that crashed serving the draft failed the check; the crash is diagnosed from
    its message with the draft's own ids (harness.diagnosis.crash; `context`: the engine's
    declared convention, the training boundaries and the layer count, where known)."""
    return failure(str(crash), draft=draft, engine_name=engine_name,
                   diagnoses=[crash_diagnosis(str(crash), layer_ids, target_hidden, **context)])


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
