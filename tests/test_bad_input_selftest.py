"""Bad `selftest` input is refused before any mutant runs: exit 2, one `error:` line, the
previous self-test's verdicts gone, and never a score (before, `--device cuda` on a CPU-only
torch or a flag pytest refuses scored every mutant "missed", 0.00, exit 1). In-process
(`cli.main`); the preflight that asks pytest about the flags after `--` is one subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_input import assert_no_selftest, one_error_line, seed_stale_selftest, symlink_loop

from harness import cli
from harness.tools import selftest


@pytest.fixture(autouse=True)
def _no_suite_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused self-test runs no mutant: a suite run here fails the test."""
    def run_suite(*args: object, **kwargs: object) -> int:
        raise AssertionError("a suite run started before the input was checked")
    monkeypatch.setattr(selftest, "run_suite", run_suite)


def _last_error_line(err: str) -> str:
    """After runs that started, their progress lines precede it: one `error:` line, the last."""
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    return one_error_line(errors[0])


def _refused(args: list[str], needle: str, root: Path, capsys: pytest.CaptureFixture[str],
             ran: bool = False) -> str:
    capsys.readouterr()
    code = cli.main(["selftest", *args])
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}: {out}{err}"
    line = _last_error_line(err) if ran else one_error_line(err)
    assert needle in line, line
    assert "mutation score" not in out, out
    assert_no_selftest(root)
    return line


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


CASES: dict[str, tuple[list[str], str]] = {
    "device-cuda-on-cpu-torch": (["--device", "cuda"], "sees no CUDA device"),
    "device-not-a-device": (["--device", "gpu"], "--device 'gpu' is not a torch device"),
    "device-meta": (["--device", "meta"], "runs on cpu or cuda"),
    "jobs-zero": (["--jobs", "0"], "--jobs 0 is not a process count"),
    "jobs-negative": (["--jobs", "-2"], "--jobs -2 is not a process count"),
    "jobs-not-int": (["--jobs", "two"], "argument --jobs: invalid int value"),
    "bundle-empty": (["--bundle", ""], "--bundle is empty"),
    "bundle-missing": (["--bundle", "/no/such/bundle"], "--bundle /no/such/bundle does not exist"),
    "mutant-unknown": (["--mutant", "no_such_bug"], "no mutant 'no_such_bug'"),
    "dtype-unknown": (["--dtype", "int4"], "invalid choice: 'int4'"),
    "profile-unknown": (["--profile", "weekly"], "invalid choice: 'weekly'"),
    "run-timeout-negative": (["--run-timeout", "-5"], "--run-timeout -5.0 is not a number of seconds"),
    "run-timeout-nan": (["--run-timeout", "nan"], "--run-timeout nan is not a number of seconds"),
    "run-timeout-not-a-number": (["--run-timeout", "soon"], "argument --run-timeout: invalid float"),
    "bf16-only-mutants": (["--dtype", "bfloat16", "--mutant", "aux_rounded_bf16"],
                          "no mutant applies in bfloat16"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_selftest_argument(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, needle = CASES[case]
    if case == "device-cuda-on-cpu-torch" and not _no_cuda():
        pytest.skip("this torch sees a CUDA device")
    root = seed_stale_selftest(tmp_path / "st")
    _refused(["--report-dir", str(root), "--no-control", *args], needle, root, capsys)


def test_bundle_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = seed_stale_selftest(tmp_path / "st")
    loop = symlink_loop(tmp_path)
    _refused(["--report-dir", str(root), "--bundle", str(loop)], "is a symlink loop", root, capsys)


def test_report_dir_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "st"
    f.write_text("mine")
    capsys.readouterr()
    assert cli.main(["selftest", "--report-dir", str(f)]) == 2
    assert "is a file, not a folder" in one_error_line(capsys.readouterr().err)
    assert f.read_text() == "mine"


def test_report_dir_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = symlink_loop(tmp_path)
    assert cli.main(["selftest", "--report-dir", str(loop)]) == 2
    assert "--report-dir" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("extra, needle", [
    pytest.param(["--no-such-flag"], "unrecognized arguments: --no-such-flag",
                 marks=pytest.mark.slow(reason="collects the suite in a subprocess for the self-test's preflight (~8 s)")),
    pytest.param(["-k", "no_check_is_named_like_this"], "select no check", marks=pytest.mark.slow(reason="collects the suite in a subprocess for the self-test's preflight (~10 s)")),
])
def test_pytest_flags_the_suite_cannot_run_with(extra: list[str], needle: str, smoke_bundle: Path,
                                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Asked of pytest itself (a collection with every flag) before any mutant runs. Each case
    collects the whole suite in a subprocess (~15 s on the 2-core CI machine): the second is
    marked slow, the first is the class the issue found."""
    root = seed_stale_selftest(tmp_path / "st")
    _refused(["--report-dir", str(root), "--no-control", "--mutant", "ids_plus_one",
              "--bundle", str(smoke_bundle), "--", *extra], needle, root, capsys)


def _runs_end(monkeypatch: pytest.MonkeyPatch, code: int, log: str) -> None:
    """Every suite run ends at once with exit `code` and `log` as its run.log (no report)."""
    def run_suite(engine: str, bundle: Path, out: Path, *args: object) -> int:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.log").write_text(log)
        return code
    monkeypatch.setattr(selftest, "run_suite", run_suite)
    monkeypatch.setattr(cli, "_selftest_preflight", lambda *a: None)


def test_a_mutant_that_did_not_run_is_not_scored(smoke_bundle: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A run that ends without a report (exit 3, a crash of the suite) is neither caught nor
    missed: named NOT RUN, left out of the score, and the self-test does not pass."""
    _runs_end(monkeypatch, 3, "error: unexpected RuntimeError: boom\n")
    root = tmp_path / "st"
    code = cli.main(["selftest", "--report-dir", str(root), "--no-control", "--mutant", "ids_plus_one",
                     "--bundle", str(smoke_bundle)])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    assert "NOT RUN" in out and "MISSED" not in out and "mutation score" not in out
    assert "no mutant run reached a verdict" in _last_error_line(err)
    assert not (root / "selftest.json").exists()


def test_a_run_that_refused_its_input_is_bad_input(smoke_bundle: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A refusal only a run could see (exit 2 in its run.log) is the self-test's bad input."""
    _runs_end(monkeypatch, 2, "noise\nerror: --xfails x is not UTF-8 text; save it as UTF-8\n")
    root = seed_stale_selftest(tmp_path / "st")
    _refused(["--report-dir", str(root), "--no-control", "--mutant", "ids_plus_one",
              "--bundle", str(smoke_bundle)], "refused its input (--xfails x is not UTF-8", root, capsys,
             ran=True)


def test_a_run_past_its_limit_is_stopped(smoke_bundle: Path, tmp_path: Path) -> None:
    """The hang test of selftest: a suite run that outlives --run-timeout (here a run given
    half a second, so it is still starting) is killed with its process group and returns
    TIMED_OUT, which the scoring counts as not run; its run.log says why."""
    import time

    from harness.tools.selftest import TIMED_OUT

    out = tmp_path / "run"
    start = time.monotonic()
    code = _real_run_suite("zoo:ids_plus_one", smoke_bundle, out, "ci", [], [], 0.5)
    assert code == TIMED_OUT and time.monotonic() - start < 15
    assert "stopped this run after 0.5 s" in (out / "run.log").read_text()


_real_run_suite = selftest.run_suite  # before the autouse fixture replaces it
