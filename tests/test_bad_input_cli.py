"""Bad `run` arguments: exit 2, one `error:` line naming the problem and the fix, and the
previous report gone (cleared before any validation can refuse the run). In-process
(`cli.main`): every case is refused before pytest starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bad_input import refused, seed_stale_report

from harness.run import registry


@pytest.mark.parametrize("args, needle", [
    (["--device", "cuda:7"], "--device cuda:7"),
    (["--device", "gpu"], "--device 'gpu' is not a torch device"),
    (["--device", "meta"], "runs on cpu or cuda"),
    (["--num-draft-tokens", "0"], "--num-draft-tokens 0 is out of range"),
    (["--num-draft-tokens", "1000"], "--num-draft-tokens 1000 is out of range"),
    (["--num-draft-tokens", "-3"], "--num-draft-tokens -3 is out of range"),
    (["--engine-timeout-scale", "-1"], "--engine-timeout-scale -1.0 is not a factor"),
    (["--engine-timeout-scale", "nan"], "--engine-timeout-scale nan is not a factor"),
    (["--dtype", "int8"], "invalid choice: 'int8'"),
    (["--engine", "nope"], "unknown engine 'nope'"),
    (["--xfails", "no/such/file.txt"], "--xfails no/such/file.txt does not exist"),
    (["--draft", "no-such-draft"], "has no draft 'no-such-draft'"),
])
def test_bad_run_argument(args: list[str], needle: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    out = seed_stale_report(tmp_path / "out")
    refused(["run", *args, "--report-dir", str(out)], capsys, needle, out)


def test_builtin_engine_without_its_adapter_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A name --help offers whose adapter module is not in this checkout (as `sglang` was):
    bad input naming the engine, not an "unavailable" engine and a nonconformant verdict."""
    monkeypatch.setitem(registry.BUILTIN, "ghost", "harness.engines.ghost:GhostEngine")
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--engine", "ghost", "--report-dir", str(out)], capsys,
            "engine 'ghost' has no adapter in this checkout", out)


@pytest.mark.parametrize("source, needle", [
    ("import not_installed_dependency_xyz\n", "needs 'not_installed_dependency_xyz'"),
    ("raise ImportError('libfoo.so: cannot open shared object file')\n", "ImportError: libfoo.so"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('CUDA driver too old')\n", "RuntimeError: CUDA driver too old"),
    ("X = 1\n", "has no 'Engine'"),
    ("class Engine:\n    pass\n", "not a subclass of harness.engines.base.Engine"),
])
def test_user_adapter_that_does_not_import(source: str, needle: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The user's own adapter failing at import is their input: exit 2, not skipped checks."""
    name = f"user_adapter_{abs(hash(source)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--engine", f"{name}:Engine", "--report-dir", str(out)], capsys, needle, out)
