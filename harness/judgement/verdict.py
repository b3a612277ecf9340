"""How a check's verdict is held and how it fails: `Judgement`, what every judge function of
the assertions returns, and `failure`/`fail`, through which every check fails with the command
that reproduces it.

One place decides pass/fail: a judge function (`judge_capture`, `judge_fc`,
`judge_decode_inputs`, the acceptance judgements) measures, holds the measure against its bound,
words why, and diagnoses a failure once; the suites and the acceptance explainer only ask the
judgement (`passed`, `diagnosis`, `verdict()`), and the raising `assert_*` helpers are
`judge_*(...).verdict()`. No torch: the plugin sets the reproducer's engine at configure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn

from harness.diagnosis.record import Diagnosis, failing_diagnoses
from harness.reports.report import ConformanceFailure

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


@dataclass(frozen=True)
class Judgement:
    """One check's verdict, decided in the assertion layer; the suites and the acceptance
    explainer only ask it. `passed`; `measured` and `bound` (what was compared with what, in the
    check's own terms); `why` (a failure's text, without the reproducer; on a pass, what was
    seen); `diagnosis`: the cause, computed once per judgement and kept here, so that the
    failure's text, report.json and whoever asks next (the acceptance explainer, the layer-id
    sweep) read the same record instead of diagnosing again. `draft`, `engine_name`, `prompts`
    and `check` name the reproducer; `reproduce` False for a failure that is not a check's own
    but wraps one that already carries its reproducer, or that precedes any comparison (non-finite
    values: harness.judgement.finite)."""

    passed: bool
    why: str
    measured: Any = None
    bound: Any = None
    diagnosis: Diagnosis | None = None
    draft: str = ""
    engine_name: str | None = None
    prompts: Sequence[Sequence[int]] | None = None
    check: str | None = None
    reproduce: bool = True

    @cached_property
    def failure(self) -> ConformanceFailure | None:
        """The failure to raise (see `failure`), None on a pass; built once, so its reproducer
        and its diagnoses are the same objects however often it is asked for."""
        if self.passed:
            return None
        diagnoses = [] if self.diagnosis is None else [self.diagnosis]
        if not self.reproduce:
            return ConformanceFailure(self.why, diagnoses)
        return failure(self.why, draft=self.draft, engine_name=self.engine_name, prompts=self.prompts,
                       diagnoses=diagnoses, check=self.check)

    @property
    def diagnoses(self) -> list[Diagnosis]:
        """What report.json records for this judgement: a failure's diagnoses as raised (a
        diagnosis `ok` on a failure reads `unrecognised`), a pass's own."""
        if self.failure is not None:
            return list(self.failure.diagnoses)
        return [] if self.diagnosis is None else [self.diagnosis]

    def verdict(self) -> Diagnosis | None:
        """Raise the failure; on a pass, the diagnosis (what a capture held, for the report)."""
        if self.failure is not None:
            raise self.failure
        return self.diagnosis
