"""Bad `conformance-table` input: report files of the wrong shape or encoding, and an `--out`
that is a folder, unwritable or not text. Exit 2, one `error:` line, and `--out` untouched
(before: wrong types gave exit 3 or a table of garbage; a folder or read-only --out exit 3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bad_input import refused, symlink_loop, unwritable_folder

from harness import cli


def good_report() -> dict[str, Any]:
    return {"engine": {"name": "x", "version": "1"}, "dtype": "float32",
            "summary": {"verdict": "conformant", "verdict_reason": "", "passed": 1, "failed": 0,
                        "skipped": 0},
            "checks": [{"id": "test_a.py::test_a", "status": "passed", "diagnoses": []}]}


def _with(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    r = good_report()
    change(r)
    return r


SHAPES: dict[str, tuple[Any, str]] = {
    "a-list": ([1, 2], "holds a JSON list"),
    "a-number": (3, "holds a JSON int"),
    "engine-a-string": (_with(lambda r: r.update(engine="vllm")), "'engine' is 'vllm'"),
    "summary-missing": (_with(lambda r: r.pop("summary")), "'summary' is None"),
    "summary-a-list": (_with(lambda r: r.update(summary=[])), "'summary' is []"),
    "verdict-a-number": (_with(lambda r: r["summary"].update(verdict=1)), "summary.verdict is 1"),
    "passed-a-string": (_with(lambda r: r["summary"].update(passed="3")), "summary.passed is '3'"),
    "passed-a-bool": (_with(lambda r: r["summary"].update(passed=True)), "summary.passed is True"),
    "failed-negative": (_with(lambda r: r["summary"].update(failed=-1)), "summary.failed is -1"),
    "xfailed-a-float": (_with(lambda r: r["summary"].update(xfailed=1.5)), "summary.xfailed is 1.5"),
    "checks-an-object": (_with(lambda r: r.update(checks={})), "'checks' is {}"),
    "check-a-string": (_with(lambda r: r.update(checks=["test_a"])), "a check entry is 'test_a'"),
    "check-id-a-number": (_with(lambda r: r["checks"][0].update(id=7)), "a check entry is"),
    "diagnoses-a-string": (_with(lambda r: r["checks"][0].update(diagnoses="offset")),
                           "'diagnoses' is 'offset'"),
    "bundle-a-string": (_with(lambda r: r.update(bundle="tiny")), "'bundle' is 'tiny'"),
    "options-a-list": (_with(lambda r: r.update(options=["cpu"])), "'options' is ['cpu']"),
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_report_of_the_wrong_shape(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, needle = SHAPES[case]
    report = tmp_path / "report.json"
    report.write_text(json.dumps(data))
    out = tmp_path / "CONFORMANCE.md"
    out.write_text("previous table")
    refused(["conformance-table", str(report), "--out", str(out)], capsys, needle)
    assert out.read_text() == "previous table"


def _file(data: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        (folder / "r.json").write_bytes(data)
        return folder / "r.json"
    return make


@pytest.mark.parametrize("case, make, needle", [
    ("not-utf8", _file(b"\xff\xfe{}"), "is not UTF-8 text"),
    ("not-json", _file(b"{oops"), "cannot read the reports"),
    ("a-folder", lambda d: d, "is not a file"),
    ("missing", lambda d: d / "none.json", "does not exist"),
    ("empty-name", lambda d: "", "REPORT.json is empty"),
    ("symlink-loop", lambda d: symlink_loop(d), "is a symlink loop"),
])
def test_report_file_that_cannot_be_read(case: str, make: Callable[[Path], Any], needle: str,
                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["conformance-table", str(make(tmp_path))], capsys, needle)


def _good(tmp_path: Path) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(good_report()))
    return path


def test_out_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    refused(["conformance-table", str(_good(tmp_path)), "--out", str(folder)], capsys, "is a folder")
    assert list(folder.iterdir()) == []


def test_out_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").write_text("a file")
    refused(["conformance-table", str(_good(tmp_path)), "--out", str(tmp_path / "docs" / "T.md")],
            capsys, "is a file, not a folder")


def test_out_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["conformance-table", str(_good(tmp_path)), "--out", ""], capsys, "--out is empty")


def test_out_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["conformance-table", str(_good(tmp_path)), "--out", str(symlink_loop(tmp_path))],
            capsys, "is a symlink loop")


def test_out_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An existing --out is read for its kept sections: bytes that are not text are refused."""
    out = tmp_path / "T.md"
    out.write_bytes(b"\xff\xfe")
    refused(["conformance-table", str(_good(tmp_path)), "--out", str(out)], capsys, "is not UTF-8 text")
    assert out.read_bytes() == b"\xff\xfe"


def test_out_unwritable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = unwritable_folder()
    if folder is None:
        pytest.skip("no folder this process cannot write in")
    refused(["conformance-table", str(_good(tmp_path)), "--out", str(folder / "T.md")], capsys,
            "cannot write in")


def test_the_control_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The good report these cases break renders, and an unpinned bundle is said so."""
    report = good_report()
    report["bundle"] = {"name": "mine", "sha256": "ab" * 32, "pinned": False}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    out = tmp_path / "T.md"
    assert cli.main(["conformance-table", str(path), "--out", str(out)]) == 0
    assert "**unpinned**" in out.read_text()
