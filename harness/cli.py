"""`eagle3-conformance`: run the suite, self-test it against the bug zoo, build and verify golden
bundles, render the conformance table.

Exit codes: 0 conformant (or success), 1 nonconformant (or a self-test that missed a mutant,
or a certificate that does not verify), 2 bad input (unknown engine, missing or corrupt
bundle, bad arguments), 3 an unexpected internal error, 130 Ctrl-C. Every error is one line on stderr, never a traceback: the inputs are checked
before pytest starts, because a traceback out of pytest's collection is where a user with a
wrong path would otherwise end up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

from harness.cli_help import apply_examples, version_text
from harness.reports.report import clear_reports, verdict_line, write_atomic
from harness.reports.report_md import kept_sections, render_conformance_table
from harness.run.options import (
    MAX_XFAILS_BYTES,
    RUN_OPTIONS,
    OptionError,
    add_run_options,
    bundle_arg_problem,
    bundle_path,
    forward,
    load_run_bundle,
    prepare_report_dir,
    validate,
)
from harness.run.pytest_modes import non_run_flag
from harness.run.run_inputs import (
    device_problem,
    input_path_problem,
    output_file_problem,
    text_file_problem,
)
from harness.run.xfails import xfails_file_name
from harness.tools.selftest import RUN_LIMIT_S

PROG = "eagle3-conformance"
DEBUG_ENV = "EAGLE3_CONFORMANCE_DEBUG"
# `golden build --arch`: the names of harness.models.target.ARCHITECTURES, spelled here so that
# `--help` loads no torch (tests/test_golden_arch.py checks the two agree)
GOLDEN_ARCHITECTURES = ("deepseek-v3", "qwen3-moe")


class CliError(Exception):
    """Bad input; the message is `<problem>; <fix>`."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C reached pytest, which stopped and wrote no report: not a verdict."""


class SuiteNotCollected(Exception):
    """Suite modules failed to import: pytest stops with the exit code it gives Ctrl-C
    ("interrupted"), but this is a broken install or a suite bug, not the user's Ctrl-C."""


class _ExitWatch:
    """A pytest plugin that tells apart the two causes behind pytest's exit code 2: a
    keyboard interrupt, or modules that did not collect (whose node ids it keeps)."""

    def __init__(self) -> None:
        self.keyboard_interrupt = False
        self.not_collected: list[str] = []

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        import pytest

        # pytest stops a session whose collection failed by raising Session.Interrupted, a
        # KeyboardInterrupt of its own: that one is not the user's
        self.keyboard_interrupt = not excinfo.errisinstance(pytest.Session.Interrupted)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.not_collected.append(report.nodeid or "<collection>")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message}; see `{self.prog} --help`")


# -- run -------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _check_engine(name: str) -> None:
    from harness.engines.base import EngineUnavailable
    from harness.run.registry import EngineLookupError, resolve_engine

    try:
        resolve_engine(name)
    except EngineLookupError as e:
        raise CliError(str(e)) from None
    except EngineUnavailable as e:
        print(f"warning: engine {name} is unavailable here ({e}); its checks will skip",
              file=sys.stderr)


def _check_bundle(path: str | Path, drafts: Sequence[str], arg: str = "--bundle",
                  pinned: bool = True) -> Any:
    try:
        return load_run_bundle(path, drafts, arg, pinned)
    except OptionError as e:
        raise CliError(str(e)) from None


def _problem(problem: str | None) -> None:
    """A problem found by a harness.run.run_inputs check is bad input: one line, exit 2."""
    if problem:
        raise CliError(problem)


def _report_dir(given: str | Path) -> Path:
    try:
        return prepare_report_dir(given)
    except OptionError as e:
        raise CliError(str(e)) from None


def _suites() -> Path:
    from harness.golden.paths import suites_path

    suites = suites_path()
    if not suites.is_dir():
        raise CliError(f"the suites folder is not at {suites}; reinstall the package (the "
                       f"wheel carries them) or run from a source checkout (`pip install -e .`)")
    return suites


def _pytest_args(a: argparse.Namespace, bundle: Path, report_dir: Path,
                 extra: Sequence[str]) -> list[str]:
    # Validating the engine imported it (and its plugins' modules) before pytest could mark
    # them for assertion rewriting; pytest's warning about that is noise here.
    args = [str(_suites()), "-W", "ignore::pytest.PytestAssertRewriteWarning",
            *forward({**vars(a), "bundle": bundle, "report_dir": report_dir})]
    if a.profile:
        args += ["--hypothesis-profile", a.profile]
    if a.k:
        args += ["-k", a.k]
    return args + list(extra)


def _read_report(report_dir: Path) -> dict[str, Any] | None:
    path = report_dir / "report.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def cmd_run(a: argparse.Namespace, extra: Sequence[str]) -> int:
    import pytest

    # cleared first: a run refused below must not leave the previous verdict standing
    report_dir = _report_dir(a.report_dir if a.report_dir is not None
                             else Path("reports") / _safe(a.engine))
    try:
        validate(vars(a))
    except OptionError as e:
        raise CliError(str(e)) from None
    _check_engine(a.engine)
    if a.xfails is None:  # the engine's own file, read by the plugin: refused here, in one line
        default = _suites() / "xfails" / xfails_file_name(a.engine)
        if default.exists():
            _problem(text_file_problem(f"the xfails file of engine {a.engine}", default,
                                       MAX_XFAILS_BYTES))
    bundle = bundle_path(a.bundle)
    _check_bundle(bundle, a.draft or ())
    watch = _ExitWatch()
    code = int(pytest.main(_pytest_args(a, bundle, report_dir, extra), plugins=[watch]))
    if code == pytest.ExitCode.INTERRUPTED and watch.not_collected and not watch.keyboard_interrupt:
        raise SuiteNotCollected(
            f"pytest could not collect {', '.join(watch.not_collected)} (the errors are above); no "
            f"verdict and no report were written — a broken install or a bug of the suite: "
            f"reinstall, and report it if it stays")
    if code == pytest.ExitCode.INTERRUPTED:
        raise RunInterrupted()
    mode = non_run_flag(extra)
    if mode is not None and code == pytest.ExitCode.OK:
        print(f"no verdict: pytest {mode} runs no check (nothing certified, no report written)",
              file=sys.stderr)
        return 0
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        raise CliError(f"{'-k ' + repr(a.k) if a.k else 'the selection'} matches no check; list "
                       f"the checks with `{PROG} run -- --collect-only -q`")
    report = _read_report(report_dir)
    if report is None or code in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        raise CliError(f"pytest stopped (exit code {code}) before writing a report; its output "
                       f"above says why")
    print(verdict_line(report, report_dir))
    return 0 if report["summary"]["verdict"] == "conformant" else 1


# -- selftest --------------------------------------------------------------------------------


SELFTEST_JSON = "selftest.json"


def _clear_selftest(root: Path, keep_runs: bool = False) -> None:
    """A previous self-test's verdicts under `root` (selftest.json, the control's and every
    mutant's reports and run records) go first: a refused or interrupted self-test leaves none
    standing. `keep_runs` (--resume) keeps the runs: each is reused only where its record
    matches, and cleared before it runs again otherwise."""
    from harness.tools.selftest import RUN_RECORD

    if not root.is_dir():
        return
    (root / SELFTEST_JSON).unlink(missing_ok=True)
    if keep_runs:
        return
    for sub in [root / "control", *sorted((root / "mutants").glob("*"))]:
        if sub.is_dir():
            clear_reports(sub)
            (sub / RUN_RECORD).unlink(missing_ok=True)


def _selftest_preflight(bundle: Path, flags: Sequence[str], profile: str,
                        extra: Sequence[str]) -> None:
    """Collect the suite once, with every flag each run will get, before any mutant runs: a
    flag pytest refuses, a -k that selects nothing or a device torch cannot use is bad input,
    which scored would read "every mutant missed"."""
    import subprocess

    cmd = [sys.executable, "-m", "pytest", str(_suites()), "--collect-only", "-q",
           "-p", "no:cacheprovider", "--engine", "reference", "--bundle", str(bundle),
           "--hypothesis-profile", profile, *flags, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    if done.returncode == 5:
        raise CliError(f"the pytest arguments after `--` ({' '.join(extra)}) select no check; "
                       f"fix them (list the checks with `{PROG} run -- --collect-only -q`)")
    said = [ln.strip() for ln in (done.stderr + done.stdout).splitlines()
            if "error" in ln.lower() and ln.strip()]
    why = (said[-1] if said else f"pytest exit code {done.returncode}").removeprefix("ERROR: ")
    raise CliError(f"the suite cannot run with these arguments ({why[:300]}); fix the flags "
                   f"after `--` or the selftest options — no mutant was scored")


def _run_error_line(report_dir: Path) -> str:
    """The `error:` line a refused suite run ended with (its run.log), or a pointer to it."""
    try:
        lines = (report_dir / "run.log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [ln for ln in lines if ln.startswith("error: ")]
    return errors[-1].removeprefix("error: ") if errors else f"see {report_dir / 'run.log'}"


def cmd_selftest(a: argparse.Namespace, extra: Sequence[str]) -> int:
    import harness
    from harness.run.registry import _mutant_class, zoo_mutants
    from harness.tools.selftest import (
        RUN_RECORD,
        TIMED_OUT,
        reusable_exit_code,
        run_key,
        run_suite,
        score_mutant,
        source_digest,
        write_run_record,
    )

    root = _report_dir(a.report_dir)  # first: a refused self-test leaves no verdict
    _clear_selftest(root, keep_runs=a.resume)
    if a.jobs < 1:
        raise CliError(f"--jobs {a.jobs} is not a process count; pass 1 or more")
    if not 0 <= a.run_timeout < float("inf"):
        raise CliError(f"--run-timeout {a.run_timeout} is not a number of seconds; pass one > 0, "
                       f"or 0 for no limit")
    _problem(device_problem(a.device) or bundle_arg_problem(a.bundle))
    bundle = bundle_path(a.bundle)
    _check_bundle(bundle, ())
    zoo = zoo_mutants()
    if not zoo:
        raise CliError("the bug zoo (harness.engines.zoo.MUTANTS) is missing or empty; "
                       "update the checkout")
    names = a.mutant or sorted(zoo)
    unknown = [n for n in names if n not in zoo]
    if unknown:
        raise CliError(f"no mutant {unknown[0]!r}; choose from {', '.join(sorted(zoo))}")
    # every run, control and mutants, in the same dtype and on the same device: a mutant must
    # stay caught, with its diagnosis, where the judgement is the reduced-precision one
    flags = forward({"dtype": a.dtype, "device": a.device})
    # a mutant whose bug is no bug in this dtype is not run: it could only be "missed"
    skipped = {n: f"not a bug in {a.dtype}" for n in names
               if a.dtype in (getattr(_mutant_class(zoo[n]), "no_bug_in_dtypes", ()) or ())}
    for name, why in skipped.items():
        print(f"{'zoo:' + name:<40} not run: {why} (excluded from the scores)")
    names = [n for n in names if n not in skipped]
    if not names:
        raise CliError(f"no mutant applies in {a.dtype}; choose others or another --dtype")
    _selftest_preflight(bundle, flags, a.profile, extra)
    runs = ([] if a.no_control else [("reference", root / "control")]) + [
        (f"zoo:{name}", root / "mutants" / _safe(name)) for name in names]
    done: list[str] = []
    digest = source_digest(Path(harness.__file__).parent, _suites())
    keys = {engine: run_key(engine, bundle, a.profile, extra, flags, digest) for engine, _ in runs}
    reused = {engine: code for engine, out in runs if a.resume
              and (code := reusable_exit_code(out, keys[engine])) is not None}
    for engine, out in runs:  # what runs again leaves no earlier verdict while it runs
        if engine not in reused and out.is_dir():
            clear_reports(out)
            (out / RUN_RECORD).unlink(missing_ok=True)
    if a.resume:
        print(f"--resume: {len(reused)} of {len(runs)} run(s) finished earlier with these sources "
              f"and flags are scored from their reports; {len(runs) - len(reused)} run now",
              file=sys.stderr, flush=True)

    def one(run: tuple[str, Path]) -> int:
        if run[0] in reused:
            return reused[run[0]]
        code = run_suite(run[0], bundle, run[1], a.profile, extra, flags, a.run_timeout or None)
        if code != TIMED_OUT:
            write_run_record(run[1], keys[run[0]], code)
        done.append(run[0])  # progress while a long selftest runs: its report.json is there now
        print(f"[{len(done)}/{len(runs) - len(reused)}] {run[0]} finished (exit {code}); "
              f"{run[1] / 'report.json'}", file=sys.stderr, flush=True)
        return code

    # each run is its own interpreter with one torch thread (suites/conftest.py), so `jobs`
    # runs side by side use `jobs` cores; the exit codes are read back in the runs' order
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        codes = dict(zip((engine for engine, _ in runs), pool.map(one, runs), strict=True))
    refused = [(engine, out) for engine, out in runs if codes[engine] == 2]
    if refused:  # bad input the preflight could not see: no run of it is a result
        engine, out = refused[0]
        raise CliError(f"the {engine} run refused its input ({_run_error_line(out)}); nothing "
                       f"was scored")
    control = None
    if not a.no_control:
        code = codes["reference"]
        report = _read_report(root / "control")
        verdict = report["summary"]["verdict"] if report and code in (0, 1) else "error"
        control = {"engine": "reference", "verdict": verdict, "report_dir": str(root / "control")}
        print(f"{'control: reference':<40} {verdict}")
    results, not_run = [], {}
    for name in names:
        out = root / "mutants" / _safe(name)
        result = score_mutant(name, zoo[name], codes[f"zoo:{name}"], _read_report(out), out)
        if "error" in result:  # it did not run to a verdict: neither caught nor missed
            not_run[name] = result["error"]
            print(f"{'zoo:' + name:<40} NOT RUN: {result['error']} ({out / 'run.log'})")
            continue
        results.append(result)
        print(f"{'zoo:' + name:<40} {'caught' if result['caught'] else 'MISSED':<7} "
              f"diagnosis {','.join(result['diagnosis_kinds']) or '-'} "
              f"(expected {result['expected_diagnosis_kind']}): "
              f"{'ok' if result['diagnosis_correct'] else 'WRONG'}")
    total = len(results)
    if not total:
        print(f"error: no mutant run reached a verdict ({len(not_run)} ended without a report; "
              f"see their run.log under {root / 'mutants'}); no score — this is a fault of the "
              f"suite or its environment, not a result", file=sys.stderr)
        return 3
    mutation_score = sum(r["caught"] for r in results) / total
    diagnosis_score = sum(r["diagnosis_correct"] for r in results) / total
    ok = (mutation_score == 1.0 and diagnosis_score == 1.0 and not not_run
          and (control is None or control["verdict"] == "conformant"))
    summary = {"format_version": 1, "bundle": str(bundle.resolve()), "profile": a.profile,
               "dtype": a.dtype, "device": a.device, "control": control, "mutants": results, "total": total,
               "not_applicable": skipped, "not_run": not_run,
               # runs scored from an earlier sitting's report (--resume), with the same sources
               "reused": sorted(reused), "sources_sha256": digest,
               "caught": sum(r["caught"] for r in results),
               "mutation_score": mutation_score, "diagnosis_score": diagnosis_score, "passed": ok}
    write_atomic(root / SELFTEST_JSON, json.dumps(summary, indent=2) + "\n")
    print(f"selftest: mutation score {mutation_score:.2f}, diagnosis score {diagnosis_score:.2f} "
          f"over the {total} mutant(s) that ran{f' ({len(not_run)} did not run)' if not_run else ''}"
          f"{'' if control is None else ', control ' + control['verdict']} — "
          f"{root / SELFTEST_JSON}")
    return 0 if ok else 1


# -- golden, table ---------------------------------------------------------------------------


def cmd_golden_build(a: argparse.Namespace, extra: Sequence[str]) -> int:
    from harness.golden.builder import BUILD_SIZES, build_bundle

    if a.threads < 1:
        raise CliError(f"--threads {a.threads} is not a thread count; pass 1 or more")
    if a.target_from and not (Path(a.target_from) / "training.json").is_file():
        raise CliError(f"{a.target_from} holds no training.json; pass the target/ folder of a "
                       f"bundle this builder wrote")
    try:
        out = build_bundle(Path(a.out), a.seed, BUILD_SIZES[a.size], threads=a.threads,
                           target_from=Path(a.target_from) if a.target_from else None,
                           tries=a.tries, device=a.device, arch=a.arch, waive=a.waive or ())
    except ValueError as e:
        raise CliError(str(e).splitlines()[0]) from None
    bundle = _check_bundle(out, (), "--out", pinned=False)  # a new build has no pin yet
    print(f"built {out}: manifest sha256 {bundle.manifest_sha256()[:16]}")
    return 0


def cmd_golden_diff(a: argparse.Namespace, extra: Sequence[str]) -> int:
    from harness.golden.bundle import bundle_differences

    first, second = (_check_bundle(a.first, (), "FIRST", pinned=False),
                     _check_bundle(a.second, (), "SECOND", pinned=False))
    diffs = bundle_differences(first, second)
    for line in diffs:
        print(line)
    if diffs:
        print(f"{len(diffs)} difference(s) between {a.first} and {a.second}")
        return 1
    print(f"identical: {len(first.manifest['files'])} files hash the same in {a.first} and {a.second}")
    return 0


def cmd_golden_verify(a: argparse.Namespace, extra: Sequence[str]) -> int:
    from harness.golden.bundle import MANIFEST
    from harness.golden.integrity import pinned_problem

    bundle = _check_bundle(a.path, (), "PATH", pinned=False)  # the pin: --pinned, below
    if a.pinned:
        problem = pinned_problem(bundle.name, Path(a.path) / MANIFEST)
        if problem:
            raise CliError(problem)
    print(f"OK {bundle.name}: drafts {', '.join(bundle.draft_names)}; manifest sha256 "
          f"{bundle.manifest_sha256()[:16]}")
    return 0


def cmd_golden_wirings(a: argparse.Namespace, extra: Sequence[str]) -> int:
    from harness.golden.wirings import wiring_table_markdown

    bundle = _check_bundle(a.path, (), "PATH", pinned=False)
    text = wiring_table_markdown(bundle.manifest)
    if text.count("\n") < 2:
        raise CliError(f"{a.path} records no wiring table (built before it existed); rebuild it "
                       f"with `{PROG} golden build`")
    print(text)
    return 0


# A report.json of the whole suite against one engine is a few hundred kilobytes; the table
# refuses what is a hundred times that rather than parse a wrong file for minutes.
MAX_REPORT_BYTES = 64 << 20


def cmd_table(a: argparse.Namespace, extra: Sequence[str]) -> int:
    for p in a.reports:
        problem = text_file_problem("REPORT.json", p, MAX_REPORT_BYTES)
        if problem:
            raise CliError(f"{problem} (a report.json written by `{PROG} run`)")
    if a.out is not None:
        _problem(output_file_problem("--out", a.out))
    try:
        text = render_conformance_table([Path(p) for p in a.reports])
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError: ValueError
        # the table reads nothing but these files: any shape it cannot read is theirs
        raise CliError(f"cannot read the reports ({str(e).splitlines()[0]}); pass report.json "
                       f"files written by `{PROG} run`") from None
    if a.out is not None:
        out = Path(a.out)
        if out.is_file():
            _problem(text_file_problem("--out", out, MAX_REPORT_BYTES))
        try:
            text += kept_sections(out.read_text(encoding="utf-8") if out.is_file() else "")
        except ValueError as e:
            raise CliError(f"{out}: {e}; close or delete that section") from None
        try:
            write_atomic(out, text)
        except OSError as e:
            raise CliError(f"--out {out} cannot be written ({e.strerror or e}); pass a writable "
                           f"path") from None
        print(f"wrote {a.out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_verify_certificate(a: argparse.Namespace, extra: Sequence[str]) -> int:
    """Exit 0 when the certificate matches its report (and the bundle), 1 when not."""
    from harness.reports.certificate import CertificateError, summary_line, verify_paths

    try:
        cert, problems = verify_paths(Path(a.certificate), Path(a.report) if a.report else None,
                                      bundle_path(a.bundle) if a.bundle else None)
    except CertificateError as e:
        raise CliError(str(e)) from None
    for line in problems:
        print(f"MISMATCH {line}")
    if problems:
        print(f"certificate {a.certificate} does NOT verify: {len(problems)} mismatch(es)")
        return 1
    bundle = "; bundle files verified" if a.bundle else "; bundle not checked (pass --bundle)"
    print(f"certificate {a.certificate} verifies: {summary_line(cert)}{bundle}")
    return 0


# -- parser ----------------------------------------------------------------------------------


def _silent(line: str) -> None:
    """--quiet: progress goes nowhere."""


def cmd_doctor(a: argparse.Namespace, extra: Sequence[str]) -> int:
    """One checkpoint pair on disk, no bundle (harness.tools.doctor). Findings on stdout; progress
    on stderr unless --quiet."""
    from harness.tools.doctor import DoctorError, run_doctor

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if a.quiet:  # transformers' weight-loading bars are progress too
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        return run_doctor(Path(a.target), Path(a.draft), a.engine, a.convention, a.device, a.dtype,
                          Path(a.report_dir) if a.report_dir else None,
                          say=lambda line: print(line, flush=True),
                          prompts_file=Path(a.prompts) if a.prompts else None,
                          progress=_silent if a.quiet else progress,
                          timeout_scale=a.engine_timeout_scale)
    except DoctorError as e:
        raise CliError(str(e)) from None


def cmd_convert_check(a: argparse.Namespace, extra: Sequence[str]) -> int:
    """A draft before and after conversion (harness.tools.convert_check): exit 0 certified, 1
    findings, 4 cannot tell."""
    from harness.tools.convert_check import ConvertCheckError, convert_check

    for arg, given in (("SOURCE", a.source), ("CONVERTED", a.converted)):
        kind = "file" if Path(given).suffix == ".gguf" or Path(given).is_file() else "folder"
        _problem(input_path_problem(arg, given, kind))
    if a.target is not None:
        _problem(input_path_problem("--target", a.target, "folder"))
    if a.json is not None:
        _problem(output_file_problem("--json", a.json))
    try:
        outcome = convert_check(Path(a.source), Path(a.converted), from_convention=a.from_convention,
                                to_engine=a.to_engine, to_convention=a.to_convention,
                                target=Path(a.target) if a.target else None)
    except ConvertCheckError as e:
        raise CliError(str(e)) from None
    for line in outcome.lines():
        print(line)
    if a.json is not None:
        try:
            write_atomic(Path(a.json), json.dumps(outcome.to_json(), indent=2) + "\n")
        except OSError as e:
            raise CliError(f"--json {a.json} cannot be written ({e.strerror or e}); pass a "
                           f"writable path") from None
    return outcome.exit_code


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Certify that an inference engine serves an EAGLE-3 "
                                       "draft the way it was trained.")
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the conformance suite against one engine",
                         description="Arguments after `--` go to pytest unchanged.")
    add_run_options(run.add_argument)
    run.add_argument("--profile", choices=("dev", "ci", "nightly"),
                     help="Hypothesis profile (default: ci under CI, else dev)")
    run.add_argument("-k", help="pytest -k expression selecting checks")
    run.set_defaults(func=cmd_run)

    st = sub.add_parser("selftest", help="run the suite against every bug-zoo mutant",
                        description="Arguments after `--` go to each pytest run.")
    st.add_argument("--report-dir", required=True)
    st.add_argument("--bundle")
    st.add_argument("--profile", choices=("dev", "ci", "nightly"), default="ci")
    st.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    for flag in ("--dtype", "--device"):
        opt = next(o for o in RUN_OPTIONS if o.flag == flag)
        st.add_argument(flag, dest=opt.dest, **{**opt.argparse_kwargs(),
                                                "help": opt.help + "; forwarded to every run"})
    st.add_argument("--no-control", action="store_true",
                    help="skip the control run that the reference engine must pass")
    st.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="suite runs side by side (one core each; default 1). Timing checks "
                         "(the throughput gate) need a core per run: keep N <= cores")
    st.add_argument("--resume", action="store_true",
                    help="score runs that finished earlier in --report-dir with the same sources, "
                         "bundle, profile and flags from their reports (their selftest_run.json "
                         "says so) and run only the rest: a long self-test continued or split "
                         "over sittings")
    st.add_argument("--run-timeout", type=float, default=RUN_LIMIT_S, metavar="S",
                    help=f"stop a suite run after S seconds and count it as not run (default "
                         f"{RUN_LIMIT_S:g}; 0: no limit). Engine calls have their own deadlines")
    st.set_defaults(func=cmd_selftest)

    golden = sub.add_parser("golden", help="build or verify a golden bundle")
    gsub = golden.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    build = gsub.add_parser("build", help="train and write a bundle (minutes on a CPU)")
    build.add_argument("--out", required=True)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--size", choices=("full", "smoke"), default="full",
                       help="full: the committed bundle; smoke: every stage on a sliver of data")
    build.add_argument("--threads", type=int, default=1,
                       help="torch threads; a build reproduces bit for bit only at the same count")
    build.add_argument("--target-from", help="reuse the target/ folder of an earlier build")
    build.add_argument("--tries", type=int, default=1,
                       help="seeds to try from --seed on until one makes a usable bundle "
                            "(about one in four does)")
    build.add_argument("--device", default="cpu",
                       help="where the target and drafts train (cpu, cuda); serving is always "
                            "measured on the CPU")
    build.add_argument("--arch", choices=GOLDEN_ARCHITECTURES, default=GOLDEN_ARCHITECTURES[0],
                       help="the target's architecture: deepseek-v3 (the committed "
                            "golden/tiny-dsv3) or qwen3-moe (golden/tiny-qwen3moe, a target "
                            "llama.cpp can capture layer inputs from)")
    build.add_argument("--waive", action="append", choices=("shift", "decay"), metavar="BAR",
                       help="measure this usability bar (shift: one boundary early costs 25%%; "
                            "decay: TTT accuracy falls by 0.05) and record it in the manifest, "
                            "but do not refuse a seed for it; repeatable")
    build.set_defaults(func=cmd_golden_build)
    diff = gsub.add_parser("diff", help="compare two bundles file by file (exit 1 if they differ)")
    diff.add_argument("first")
    diff.add_argument("second")
    diff.set_defaults(func=cmd_golden_diff)
    verify = gsub.add_parser("verify", help="check a bundle's manifest, hashes and shapes")
    verify.add_argument("path")
    verify.add_argument("--pinned", action="store_true",
                        help="also require the manifest digest pinned for the committed bundle "
                             "(detects a tampered bundle whose hashes were recomputed)")
    verify.set_defaults(func=cmd_golden_verify)
    wir = gsub.add_parser("wirings", help="print a bundle's held-out acceptance per draft, served "
                                          "as trained and under each wrong wiring (markdown)")
    wir.add_argument("path")
    wir.set_defaults(func=cmd_golden_wirings)

    from harness.tools.doctor import MAX_PROMPTS, MAX_ROUNDS, ROUND_PROMPTS, SAMPLE_LEN
    from harness.tools.doctor_outcome import EXIT_HELP

    doc = sub.add_parser(
        "doctor", help="diagnose one target/draft pair on disk (no bundle)",
        description="Says whether ENGINE feeds the draft the hidden states it was trained on, "
                    "from what the engine captures and what the draft's weights say: \"wired as "
                    "trained\", \"miswired: trained at X, served at Y, fix Z\" (the fix re-served "
                    "to verify it), or \"cannot tell\" (which candidates the weights do not "
                    "separate, and what would).", epilog=EXIT_HELP)
    doc.add_argument("--target", required=True, help="HF-format target folder")
    doc.add_argument("--draft", required=True, help="EAGLE-3 draft folder (config.json, model.safetensors)")
    doc.add_argument("--engine", default="reference",
                     help="engine to serve the draft (default: reference, the training-time "
                          "reference that works after `pip install -e .`; vllm needs "
                          "pip install -e '.[vllm]')")
    doc.add_argument("--convention", help="the trainer's layer-id convention (a key of "
                                          "harness.core.boundaries.CONVENTIONS): printed as an "
                                          "ASSUMPTION and weighed against the weights, never "
                                          "taken as the verdict")
    doc.add_argument("--device", default="cpu", help="cpu, or cuda for a large target")
    doc.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                     help="engine dtype (default: the engine's)")
    doc.add_argument("--report-dir", help="write report.json/md/html here (emptied first)")
    doc.add_argument("--prompts", help=f"JSON list of at most {MAX_PROMPTS} token-id lists from the "
                                       f"draft's training data, each continued 32 tokens by the "
                                       f"target and scored (default: the doctor samples text from "
                                       f"the target, {ROUND_PROMPTS} texts of {SAMPLE_LEN} tokens a "
                                       f"round, up to {MAX_ROUNDS} rounds, until the outcome is "
                                       f"decided)")
    opt = next(o for o in RUN_OPTIONS if o.flag == "--engine-timeout-scale")
    doc.add_argument(opt.flag, dest=opt.dest, **opt.argparse_kwargs())
    doc.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    doc.set_defaults(func=cmd_doctor)

    from harness.tools.convert_check import ENGINES

    cc = sub.add_parser(
        "convert-check", help="certify a draft conversion: same training boundaries, same weights",
        description="Compares an EAGLE-3 draft before conversion (SOURCE) with the converted draft "
                    "(CONVERTED: a folder in SpecForge or speculators format, or a .gguf): whether "
                    "the converted ids mean the same training boundaries under the target engine's "
                    "rule as the source ids under the trainer's, and whether fc, the norms, "
                    "d2t/t2d, embeddings and lm_head are unchanged (bit for bit, or within the "
                    "rounding of a narrower dtype the converter chose).",
        epilog="exit codes: 0 certified, 1 not certified (findings), 2 bad input, 4 cannot tell")
    cc.add_argument("source", metavar="SOURCE", help="the draft before conversion (folder or .gguf)")
    cc.add_argument("converted", metavar="CONVERTED", help="the converted draft (folder or .gguf)")
    cc.add_argument("--from-convention", metavar="NAME",
                    help="the trainer's layer-id rule for SOURCE (a key of "
                         "harness.core.boundaries.CONVENTIONS, e.g. specforge, embedding-minus-one); "
                         "default: a bundle manifest's record, else the rule of the engine SOURCE's "
                         "format is for (speculators: vllm, gguf: llamacpp)")
    to = cc.add_mutually_exclusive_group()
    to.add_argument("--to-engine", metavar="NAME",
                    help=f"the engine CONVERTED is for ({', '.join(ENGINES)}); its rule is chosen "
                         f"by the target's architecture. Default: the engine CONVERTED's format is for")
    to.add_argument("--to-convention", metavar="NAME", help="the target engine's layer-id rule, named "
                                                             "directly (e.g. sglang-deepseek)")
    cc.add_argument("--target", metavar="TARGET_DIR",
                    help="the target model's folder (its layer count and architecture); default: "
                         "the verifier a speculators config names, where it exists here")
    cc.add_argument("--json", metavar="OUT", help="also write the outcome as JSON here")
    cc.set_defaults(func=cmd_convert_check)

    table = sub.add_parser("conformance-table", help="render docs/CONFORMANCE.md from reports")
    table.add_argument("reports", nargs="+", metavar="REPORT.json")
    table.add_argument("--out", help="write here (default: stdout)")
    table.set_defaults(func=cmd_table)

    vc = sub.add_parser("verify-certificate", help="check a certificate.json against its report "
                                                   "(and the bundle): exit 0 valid, 1 mismatch")
    vc.add_argument("certificate", metavar="CERTIFICATE.json")
    vc.add_argument("--report", help="the report.json it summarises (default: beside it)")
    vc.add_argument("--bundle", help="also check the bundle folder the run used")
    vc.set_defaults(func=cmd_verify_certificate)
    apply_examples(p)
    return p


def _clear_refused_run(argv: Sequence[str]) -> None:
    """A `run`, `selftest` or `doctor` refused while its arguments were parsed (before the
    command could clear its report folder) must not leave the previous verdict standing
    either: clear the folder it names."""
    if not argv or argv[0] not in ("run", "selftest", "doctor"):
        return
    given = None
    for i, arg in enumerate(argv):
        if arg == "--report-dir" and i + 1 < len(argv):
            given = argv[i + 1]
        elif arg.startswith("--report-dir="):
            given = arg.split("=", 1)[1]
    if given and input_path_problem("--report-dir", given, "folder") is None:
        try:
            (_clear_selftest if argv[0] == "selftest" else clear_reports)(Path(given))
        except OSError:
            pass


def _doing(argv: Sequence[str], error: BaseException) -> str:
    """What the suite was doing when it failed itself (exit 3): the command and the deepest
    frame of the suite's own code, so a bug report names a place without a traceback."""
    import traceback

    command = next((a for a in argv if not a.startswith("-")), "(no command)")
    root = Path(__file__).resolve().parent
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if Path(f.filename).resolve().is_relative_to(root)]
    where = (f" in {Path(frames[-1].filename).resolve().relative_to(root.parent)}:"
             f"{frames[-1].lineno} ({frames[-1].name})") if frames else ""
    return f"running `{command}`{where}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
        if extra and args.func not in (cmd_run, cmd_selftest):
            raise CliError("arguments after `--` are only for run and selftest")
        return args.func(args, extra)
    except CliError as e:
        _clear_refused_run(argv)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); no verdict and no report were written — rerun to "
              "certify", file=sys.stderr)
        return 130
    except SuiteNotCollected as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except Exception as e:
        if os.environ.get(DEBUG_ENV):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"error: unexpected {type(e).__name__}: {first}; a bug of the suite, raised while "
              f"{_doing(argv, e)}; rerun with {DEBUG_ENV}=1 for the traceback and report it",
              file=sys.stderr)
        return 3


def entry() -> NoReturn:
    """The console script and `python -m harness.cli`: main(), then an exit that no engine
    thread still running (a hung call, or one Ctrl-C left) can turn into an abort."""
    status = main()
    from harness.run import timeouts

    if timeouts.join_abandoned(0):
        # an engine call that never ended still runs in a daemon thread: interpreter shutdown
        # under it can abort the process and replace the exit status; end without it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
