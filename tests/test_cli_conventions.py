"""CLI conventions (issue #35): --version, an example in every subcommand's --help, no verdict
from pytest modes that run no check, Ctrl-C's exit on every path, and the throughput checks
under pytest-xdist (measured in one process or skipped with the reason, never passed
unmeasured)."""

from __future__ import annotations

import _thread
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from bad_input import (
    KeyboardInterruptHandler,
    assert_no_report,
    ctrl_c_as_a_shell_gives_it,
    seed_stale_report,
)

from harness import __version__, cli
from harness.run import timeouts
from harness.run.pytest_modes import non_run_flag

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env.pop("CI", None)
    return env


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"eagle3-conformance {__version__} (commit "), out


def _parsers(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}".strip())
    return out


def test_every_subcommand_help_has_runnable_examples() -> None:
    parsers = _parsers(cli.build_parser())
    assert {"run", "selftest", "golden build", "verify-certificate"} <= {p for p, _ in parsers}
    for path, parser in parsers:
        text = parser.format_help()
        assert "examples:\n  eagle3-conformance " in text, f"`{path or '(top)'} --help` has no example"
        for line in text.split("examples:\n", 1)[1].splitlines():
            if line.strip() and path and "<command>" not in line:
                assert line.strip().startswith(f"eagle3-conformance {path}"), (path, line)


@pytest.mark.parametrize(("args", "mode"), [(["--collect-only", "-q"], "--collect-only"),
                                            (["--co"], "--collect-only"),
                                            (["--fixtures"], "--fixtures"),
                                            (["--setup-plan"], "--setup-plan"),
                                            (["-x", "-q"], None)])
def test_non_run_flags(args: list[str], mode: str | None) -> None:
    assert non_run_flag(args) == mode


@pytest.mark.parametrize("flag", ["--collect-only", "--fixtures", "--setup-plan"])
def test_plugin_writes_no_report_in_a_mode_that_runs_no_check(pytester: pytest.Pytester,
                                                               flag: str) -> None:
    pytester.makepyfile(test_c="def test_c(report):\n    report.metric('d', 'x', 1)\n")
    out = seed_stale_report(pytester.path / "out")
    result = pytester.runpytest_inprocess(flag, "--report-dir", str(out), "-p", "no:cacheprovider")
    assert result.ret == 0
    assert_no_report(out)
    assert "verdict:" not in result.stdout.str()


@pytest.mark.slow(reason="collects the whole suite in a subprocess (~8 s)")
def test_run_collect_only_is_no_verdict(tmp_path: Path) -> None:
    """The whole suite collected on the committed bundle: exit 0, the checks listed, no report
    and no "nonconformant" (it used to exit 1 with an all-skipped report)."""
    out = seed_stale_report(tmp_path / "out")
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--report-dir", str(out),
                           "--", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "test_aux_capture.py::test_capture_pinned_prompts" in proc.stdout
    assert "nonconformant" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("no verdict: pytest --collect-only")
    assert_no_report(out)


def test_ctrl_c_abandons_the_engine_thread_it_leaves_running() -> None:
    """A Ctrl-C while an engine call runs leaves its daemon thread in engine code; it is
    recorded like a hung call's, so the CLI exits through os._exit instead of an interpreter
    shutdown under it (an abort, exit 134, was the one path that did not give 130)."""
    release = threading.Event()
    with KeyboardInterruptHandler(), pytest.raises(KeyboardInterrupt):
        threading.Timer(0.3, _thread.interrupt_main).start()
        timeouts.call_with_deadline(release.wait, (30,), 60.0, "capture")
    try:
        assert timeouts.join_abandoned(0) == 1
    finally:
        release.set()
        assert timeouts.join_abandoned(5) == 0


@pytest.mark.parametrize("entry", ["module", "console-script"])
def test_ctrl_c_inside_a_torch_op_exits_130_not_an_abort(entry: str, tmp_path: Path) -> None:
    """The path that exited 134: Ctrl-C at an engine's first torch op. The interrupt reached
    the main thread inside Thread.start() (before the deadline wait), the engine thread was
    never recorded as abandoned, and interpreter shutdown ran under its torch op ("terminate
    called without an active exception", SIGABRT). Both entry points must give 130."""
    out = seed_stale_report(tmp_path / "out")
    argv = ["run", "--engine", "misbehaving_adapters:InterruptedMidTorchOp", "--draft",
            "single-aux", "--report-dir", str(out), "--profile", "dev", "-k",
            "test_capture_pinned_prompts", "--", "-q", "-p", "no:cacheprovider"]
    cmd = ([sys.executable, "-m", "harness.cli", *argv] if entry == "module" else
           [sys.executable, "-c", "import sys; from harness.cli import entry; sys.argv[1:] = "
            f"{argv!r}; entry()"])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300,
                          check=False, preexec_fn=ctrl_c_as_a_shell_gives_it)
    assert proc.returncode == 130, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C)")
    assert_no_report(out)


def test_console_script_shares_the_exit_guard() -> None:
    """`eagle3-conformance` (the console script) and `python -m harness.cli` end through the
    same `entry()`, which skips interpreter shutdown under an abandoned engine thread."""
    text = (ROOT / "pyproject.toml").read_text()
    assert 'eagle3-conformance = "harness.cli:entry"' in text
    source = (ROOT / "harness" / "cli.py").read_text()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    entry()')


@pytest.mark.slow(reason="runs the throughput checks under pytest-xdist in a subprocess (~20 s)")
def test_throughput_under_xdist_is_skipped_with_the_reason_never_passed(tmp_path: Path) -> None:
    """Slow (~1 min on 2 cores): two xdist workers each start torch and the engine. Under -n,
    pytest-benchmark times nothing, and the gate's timings would share cores with the other
    worker: every throughput check must skip saying so, and the certificate must not count
    throughput as judged."""
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "suites/test_throughput.py",
                           "--engine", "reference", "--draft", "single-aux", "-q", "-rs",
                           "-p", "no:cacheprovider", "--report-dir", str(out)],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
                          check=False)
    report = json.loads((out / "report.json").read_text())
    checks = {c["id"].split("::")[1].split("[")[0]: c for c in report["checks"]}
    assert set(checks) == {"test_throughput_plain", "test_throughput_speculative",
                           "test_speculation_pays_as_predicted"}, (proc.stdout, time.monotonic() - t0)
    for name, c in checks.items():
        assert c["status"] == "skipped" and c["message"].startswith("not measured: "), (name, c)
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["concerns"]["throughput"]["verdict"] == "not_judged"
    assert "throughput" in cert["scope"]["not_judged"]
