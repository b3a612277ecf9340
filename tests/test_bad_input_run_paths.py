"""`run`'s path arguments, checked before anything runs (harness.run.run_inputs): empty, symlink
loops, the wrong kind, unwritable, and xfails files that are not UTF-8 text or are far too
big. Exit 2, one `error:` line, the previous report gone. Before: `--bundle ''` ran the
committed bundle, a non-UTF-8 xfails file was an INTERNALERROR out of pytest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from bad_input import refused, seed_stale_report, symlink_loop, unwritable_folder

from harness import cli
from harness.run.options import MAX_XFAILS_BYTES
from harness.run.xfails import XfailsError, read_xfails


def _file(name: str, data: bytes) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).write_bytes(data)
        return str(folder / name)
    return make


def _dangling(folder: Path) -> str:
    (folder / "gone").symlink_to(folder / "nowhere")
    return str(folder / "gone")


CASES: dict[str, tuple[str, Callable[[Path], str], str]] = {
    "bundle-empty": ("--bundle", lambda d: "", "--bundle is empty"),
    "bundle-loop": ("--bundle", lambda d: str(symlink_loop(d)), "is a symlink loop"),
    "bundle-a-file": ("--bundle", _file("b.tar", b""), "is not a folder"),
    "bundle-dangling-link": ("--bundle", _dangling, "is a symlink to nothing"),
    "xfails-not-utf8": ("--xfails", _file("x.txt", b"test_a*  # \xff\xfe reason\n"), "is not UTF-8 text (byte 0xff"),
    "xfails-too-big": ("--xfails", _file("x.txt", b"#" * (MAX_XFAILS_BYTES + 1)), "more than the"),
    "xfails-a-folder": ("--xfails", lambda d: str(d), "is not a file"),
    "xfails-loop": ("--xfails", lambda d: str(symlink_loop(d, "xloop")), "is a symlink loop"),
    "xfails-empty": ("--xfails", lambda d: "", "--xfails is empty"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_run_path(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flag, make, needle = CASES[case]
    out = seed_stale_report(tmp_path / "out")
    refused(["run", flag, make(tmp_path), "--report-dir", str(out)], capsys, needle, out)


@pytest.mark.parametrize("make, needle", [
    (lambda d: str(_file("r", b"mine")(d)), "is a file, not a folder"),
    (lambda d: str(Path(_file("r", b"mine")(d)) / "sub"), "is a file, not a folder"),
    (lambda d: str(symlink_loop(d)), "is a symlink loop"),
    (lambda d: "", "--report-dir is empty"),
], ids=["a-file", "under-a-file", "loop", "empty"])
def test_bad_report_dir(make: Callable[[Path], str], needle: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    refused(["run", "--report-dir", make(tmp_path)], capsys, needle)


def test_unwritable_report_dir(capsys: pytest.CaptureFixture[str]) -> None:
    folder = unwritable_folder()
    if folder is None:
        pytest.skip("no folder this process cannot write in")
    refused(["run", "--report-dir", str(folder / "reports")], capsys, "cannot write in")


def test_the_engines_own_xfails_file_not_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """suites/xfails/<engine>.txt is read by the plugin; refused by the CLI before pytest."""
    suites = tmp_path / "suites"
    (suites / "xfails").mkdir(parents=True)
    (suites / "xfails" / "reference.txt").write_bytes(b"\xc3\x28 broken\n")
    monkeypatch.setattr(cli, "_suites", lambda: suites)
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--report-dir", str(out)], capsys, "the xfails file of engine reference", out)


def test_read_xfails_says_one_line(tmp_path: Path) -> None:
    """The plugin's reader (a direct `pytest --engine`) turns it into a usage error line."""
    path = tmp_path / "x.txt"
    path.write_bytes(b"ok_line\n\xff\n")
    with pytest.raises(XfailsError, match=r"is not UTF-8 text \(byte 0xff at offset 8\)"):
        read_xfails(path)
