"""The run options, defined once: their flags, defaults, help and choices, and the validation of
their values. The pytest plugin registers them (`pytest --engine ...`); the CLI's `run`
registers the same ones, validates with the same functions before pytest starts (so bad input
is one line, not a traceback out of collection) and forwards them to pytest unchanged.

Imports no torch and no engine: the plugin loads in every pytest run of the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.tolerances import DTYPES
from harness.reports.report import clear_reports
from harness.run.registry import EngineLookupError, check_engine_name
from harness.run.run_inputs import (
    input_path_problem,
    output_dir_problem,
    run_option_problem,
    text_file_problem,
)


class OptionError(ValueError):
    """A bad option value; the message is one line, `<problem>; <fix>`."""


@dataclass(frozen=True)
class RunOption:
    flag: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    action: str | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def argparse_kwargs(self) -> dict[str, Any]:
        """What both argparse and pytest's addoption take."""
        kwargs = {"help": self.help, "default": self.default, "choices": self.choices,
                  "type": self.type, "action": self.action, "metavar": self.metavar}
        return {k: v for k, v in kwargs.items() if v is not None}


RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("--engine", "engine adapter: reference, vllm, sglang, llamacpp, zoo:<mutant> or "
                          "package.module:Class (default: reference)",
              default="reference", metavar="NAME"),
    RunOption("--bundle", "golden bundle folder (default: the committed golden/tiny-dsv3)",
              metavar="PATH"),
    RunOption("--draft", "run only this draft of the bundle (repeatable; default: every draft)",
              action="append", metavar="NAME"),
    RunOption("--dtype", "engine dtype (default: the engine's own, e.g. float32 reference, "
                         "bfloat16 vllm)", choices=DTYPES),
    RunOption("--device", "engine device (default: cpu)", default="cpu"),
    RunOption("--num-draft-tokens", "chain length k of speculative decoding (default: 4)",
              default=4, type=int, metavar="K"),
    RunOption("--report-dir", "write report.json, report.md, report.html and junit.xml here "
                              "(`eagle3-conformance run`: default reports/<engine>)",
              metavar="DIR"),
    RunOption("--xfails", "known-nonconformance list (default: suites/xfails/<engine>.txt, "
                          "the engine name with every character but letters, digits, . - _ "
                          "as _)", metavar="FILE"),
    RunOption("--engine-timeout-scale", "multiply every engine call's deadline (scaled to its "
                                        "work, see harness/run/timeouts.py) by F; 0 turns the "
                                        "deadlines off (default: 1)",
              default=1.0, type=float, metavar="F"),
)


def add_run_options(add: Callable[..., Any]) -> None:
    """Register every run option with `add` (argparse's add_argument, pytest's addoption)."""
    for opt in RUN_OPTIONS:
        add(opt.flag, dest=opt.dest, **opt.argparse_kwargs())


def forward(values: Mapping[str, Any]) -> list[str]:
    """The pytest arguments that pass `values` (by dest) on unchanged; unset ones are left out."""
    args: list[str] = []
    for opt in RUN_OPTIONS:
        value = values.get(opt.dest)
        if value is None:
            continue
        for v in value if opt.action == "append" else [value]:
            args += [opt.flag, str(v)]
    return args


# An xfails file is one line per known nonconformance; a megabyte is thousands of checks more
# than the suite has, so a bigger one is the wrong file (a log, a binary), not a list.
MAX_XFAILS_BYTES = 1 << 20


def validate(values: Mapping[str, Any]) -> None:
    """The checks that need no engine loaded: engine name syntax, k, the timeout scale, the
    device (harness.run.run_inputs), the bundle path, the xfails file."""
    try:
        check_engine_name(values["engine"])
    except EngineLookupError as e:
        raise OptionError(str(e)) from None
    problem = (run_option_problem(values["device"], values["num_draft_tokens"],
                                  values["engine_timeout_scale"])
               or bundle_arg_problem(values.get("bundle")))
    if problem:
        raise OptionError(problem)
    xfails = values.get("xfails")
    if xfails is not None:
        problem = text_file_problem("--xfails", xfails, MAX_XFAILS_BYTES)
        if problem:
            raise OptionError(problem + " (or drop --xfails)")


def prepare_report_dir(given: str | Path) -> Path:
    """Create the folder and remove an earlier run's reports from it (first thing in a run,
    so that even a run refused later leaves no stale report). `given` as the user wrote it:
    an empty one is refused, not read as the current folder."""
    problem = output_dir_problem("--report-dir", given)
    if problem:
        raise OptionError(problem)
    path = Path(given)
    try:
        path.mkdir(parents=True, exist_ok=True)
        clear_reports(path)
    except OSError as e:
        raise OptionError(f"cannot use report dir {path} ({e.strerror or e}); pass a writable "
                          f"--report-dir") from None
    return path


def bundle_path(given: str | Path | None) -> Path:
    """The bundle `--bundle` names; the committed one only when it names none (None): an
    empty `--bundle ''` is refused by `validate`, never read as "the default". A committed
    bundle's name (`tiny-qwen3moe`, or `golden/tiny-qwen3moe`) that is no folder here names the
    committed copy (the checkout's, or the installed wheel's): outside a checkout that is the
    only way to reach the second bundle, and it is the pinned one, checked on every run."""
    from harness.golden.paths import committed_bundle_path, default_bundle_path
    from harness.golden.pins import PINNED_MANIFESTS

    if given is None:
        return default_bundle_path()
    path = Path(given)
    if (str(given) and not path.exists() and path.name in PINNED_MANIFESTS
            and path.parts in ((path.name,), ("golden", path.name))):
        committed = committed_bundle_path(path.name)
        if committed.is_dir():
            return committed
    return path


def bundle_arg_problem(given: str | Path | None) -> str | None:
    """What is wrong with `--bundle` as given (None and '' judged as written: no bundle, and a
    refused empty one), after a committed bundle's name is resolved (`bundle_path`)."""
    return input_path_problem("--bundle", given if not given else bundle_path(given), "folder")


def load_run_bundle(path: str | Path, drafts: Sequence[str] = (), arg: str = "--bundle",
                    pinned: bool = True) -> Any:
    """The bundle, loaded and hash-verified, its drafts linted clean, the committed one at its
    pinned digest (unless `pinned` is False: `golden build` writing a new one), with every
    requested draft in it. Anything else is bad input (a bundle that cannot be trusted
    certifies nothing), never a verdict about the engine."""
    from harness.golden.bundle import BundleError, load_bundle
    from harness.run.bundle_gate import bundle_lint_problem, committed_pin_problem

    problem = input_path_problem(arg, path, "folder")  # the string as given: '' is not '.'
    if problem:
        raise OptionError(problem)
    try:
        bundle = load_bundle(path)
    except BundleError as e:
        raise OptionError(str(e)) from None
    problem = (committed_pin_problem(bundle) if pinned else None) or bundle_lint_problem(bundle)
    if problem:
        raise OptionError(problem)
    for d in drafts:
        if d not in bundle.draft_names:
            raise OptionError(f"bundle {path} has no draft {d!r}; choose from "
                              f"{', '.join(bundle.draft_names)}")
    return bundle
