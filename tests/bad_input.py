"""Helpers of the bad-input tests (tests/test_bad_input_*.py): seed a stale report, assert the
one error line, copy and tamper with a bundle and recompute its hashes (so that only the
checks beyond the hashes can refuse it)."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import cli
from harness.reports.report import REPORT_FILES  # certificate.json and badge.svg too

STALE = {"summary": {"verdict": "conformant"}, "stale": True}


def seed_stale_report(report_dir: Path) -> Path:
    """A previous run's report saying "conformant": a refused run must not leave it behind."""
    report_dir.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        (report_dir / name).write_text(json.dumps(STALE) if name.endswith(".json") else "stale")
    (report_dir / "notes.txt").write_text("the user's own file")
    return report_dir


def assert_no_report(report_dir: Path) -> None:
    left = [n for n in REPORT_FILES if (report_dir / n).exists()]
    assert not left, f"stale or partial report files remain: {left}"
    partial = [p.name for p in report_dir.glob(".*") if p.is_file()]
    assert not partial, f"partial files remain: {partial}"
    assert (report_dir / "notes.txt").is_file(), "a file that is not a report was deleted"


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{err}"
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], needle: str,
            report_dir: Path | None = None) -> str:
    """cli.main(argv) exits 2 with one `error:` line containing `needle`, leaving no report."""
    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, f"exit {code}, stderr: {captured.err}"
    line = one_error_line(captured.err)
    assert needle in line, line
    if report_dir is not None:
        assert_no_report(report_dir)
    return line


def rehash(bundle: Path) -> None:
    """Recompute every listed file's sha256: a tamperer can, so the hashes alone prove nothing."""
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    if isinstance(manifest.get("files"), dict):
        for rel in list(manifest["files"]):
            f = bundle / rel
            if (isinstance(manifest["files"][rel], str) and f.is_file() and ".." not in rel
                    and not Path(rel).is_absolute()):
                manifest["files"][rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def tampered(src: Path, dest: Path, change: Callable[[Path], Any]) -> Path:
    """A copy of bundle `src` changed by `change(copy)`, its hashes recomputed."""
    shutil.copytree(src, dest)
    change(dest)
    rehash(dest)
    return dest


def edit_json(path: Path, change: Callable[[dict], Any]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def symlink_loop(folder: Path, name: str = "loop") -> Path:
    """A path that is a symlink to itself: `Path.resolve` raises RuntimeError on it (before
    Python 3.13), `is_dir` merely says False."""
    link = folder / name
    link.symlink_to(link)
    return link


def seed_stale_selftest(root: Path) -> Path:
    """A previous self-test's verdicts: selftest.json, the control's and a mutant's report."""
    seed_stale_report(root)
    (root / "selftest.json").write_text(json.dumps({"passed": True, "stale": True}))
    for sub in (root / "control", root / "mutants" / "ids_plus_one"):
        seed_stale_report(sub)
    return root


def assert_no_selftest(root: Path) -> None:
    assert not (root / "selftest.json").exists(), "a stale selftest.json remains"
    for sub in (root / "control", root / "mutants" / "ids_plus_one"):
        if sub.is_dir():
            assert_no_report(sub)


def unwritable_folder() -> Path | None:
    """A folder this process cannot write in (a chmod does not stop root; /sys does), or None."""
    import tempfile

    for candidate in (Path("/sys"), Path("/proc")):
        if candidate.is_dir():
            try:
                tempfile.TemporaryFile(dir=candidate).close()
            except OSError:
                return candidate
    return None


def ctrl_c_as_a_shell_gives_it() -> None:
    """`preexec_fn` of a subprocess that must see Ctrl-C the way a user's terminal delivers it.
    A job started in the background of a non-interactive shell (a CI runner's script, or
    `(cmd &)`) inherits SIGINT *ignored*, and Python then never raises KeyboardInterrupt: the
    Ctrl-C tests would see the interrupted run pass and exit 0 (measured: all three failed so
    when the unit tests were launched that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class KeyboardInterruptHandler:
    """Python's own SIGINT handler for the duration of a `with` block, whatever the process
    inherited (see `ctrl_c_as_a_shell_gives_it`): `_thread.interrupt_main` does nothing while
    SIGINT is ignored."""

    def __enter__(self) -> None:
        self._old = signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._old)
