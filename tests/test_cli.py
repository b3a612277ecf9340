"""The CLI's error paths: bad input exits 2 with one line on stderr and no traceback, before
pytest starts; and the run command's verdict line and exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import cli
from harness.reports import report, report_md


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv, needle", [
    ([], "required: COMMAND"),
    (["run", "--engine", "nope"], "unknown engine 'nope'"),
    (["run", "--engine", "zoo:no_such_mutant"], "no bug-zoo mutant"),
    (["run", "--engine", "vendor_pkg_missing.mod:Engine"], "cannot import vendor_pkg_missing.mod"),
    (["run", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["run", "--num-draft-tokens", "four"], "invalid int value"),
    (["selftest"], "--report-dir"),
    (["golden", "build"], "--out"),
    (["golden", "verify"], "path"),
    (["conformance-table", "missing.json"], "missing.json does not exist"),
    (["golden", "verify", "x", "--", "-q"], "only for run and selftest"),
    (["golden", "build", "--out", "x", "--threads", "0"], "--threads 0 is not a thread count"),
    (["golden", "build", "--out", "x", "--size", "huge"], "invalid choice: 'huge'"),
    (["golden", "build", "--out", "x", "--target-from", "nowhere"], "nowhere holds no training.json"),
    (["golden", "build", "--out", "x", "--device", "tpu"], "--device tpu is not a torch device"),
    (["golden", "build", "--out", "x", "--device", "mps"], "the builder trains on cpu or cuda"),
    (["golden", "build", "--out", "x", "--tries", "0"], "--tries 0 is not a number of seeds"),
    (["golden", "diff", "nowhere", "golden/tiny-dsv3"], "nowhere"),
])
def test_bad_input_is_one_line_exit_2(argv: list[str], needle: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert needle in _one_line_error(capsys)


def test_missing_bundle_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--bundle", str(tmp_path / "nowhere"),
                     "--report-dir", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys)
    assert str(tmp_path / "nowhere") in line and ";" in line
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize("manifest", [None, "{not json", '{"format_version": 99}'])
def test_malformed_bundle(tmp_path: Path, manifest: str | None,
                          capsys: pytest.CaptureFixture[str]) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    if manifest is not None:
        (bundle / "manifest.json").write_text(manifest)
    assert cli.main(["run", "--bundle", str(bundle)]) == 2
    assert str(bundle) in _one_line_error(capsys)
    assert cli.main(["golden", "verify", str(bundle)]) == 2
    _one_line_error(capsys)


def test_unwritable_report_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_check_bundle", lambda path, drafts: None)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["run", "--report-dir", str(blocker / "sub")]) == 2
    assert "--report-dir" in _one_line_error(capsys)


def test_unexpected_error_is_one_line_exit_3(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def boom(args, extra):
        raise RuntimeError("kaput\nsecond line")

    monkeypatch.setattr(cli, "cmd_table", boom)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["conformance-table", "x.json"]) == 3
    line = _one_line_error(capsys)
    assert "unexpected RuntimeError: kaput;" in line
    # exit 3 says what the suite was doing: the command and the suite's own frame
    assert "while running `conformance-table` in tests/test_cli.py" not in line
    assert "running `conformance-table`" in line


def test_conformance_table_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    collector = report.ReportCollector()
    collector.check("t.py::c[d]", "t.py::c[d]", "d", True).settle("passed", "")
    data = collector.build(engine={"name": "reference", "version": "v"}, bundle={}, drafts=["d"],
                           dtype="float32", started=0.0, finished=1.0)
    src = tmp_path / "report.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "docs" / "CONFORMANCE.md"
    assert cli.main(["conformance-table", str(src), "--out", str(out)]) == 0
    assert out.read_text() == report_md.render_conformance_table([src])
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{")
    capsys.readouterr()
    assert cli.main(["conformance-table", str(garbage)]) == 2
    assert "cannot read the reports" in _one_line_error(capsys)


def test_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--engine", "nope"],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow(reason="runs the suite in a subprocess (~8 s)")
def test_run_prints_the_verdict_line(tmp_path: Path) -> None:
    """The run command end to end on a throwaway suite (no engine: the verdict can only be
    nonconformant, exit 1). Runs in a child process: pytest.main inside this session's
    capture would fight it."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_tiny.py").write_text(textwrap.dedent("""
        import pytest

        def test_records(report):
            report.metric("d", "acceptance_length", 1.5)

        def test_skips(report):
            pytest.skip("not applicable here")
    """))
    (tmp_path / "no-xfails.txt").write_text("")
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import harness.cli as cli
        import harness.golden.paths as paths
        paths.suites_path = lambda: Path({str(suites)!r})
        cli._check_bundle = lambda path, drafts: None
        sys.exit(cli.main(["run", "--report-dir", {str(tmp_path / "out")!r},
                           "--xfails", {str(tmp_path / "no-xfails.txt")!r}, "--", "-q",
                           "-p", "no:cacheprovider", "--rootdir", {str(tmp_path)!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert last.startswith("verdict: nonconformant (1 passed, 0 failed, 1 skipped)")
    assert last.endswith(f"report: {tmp_path / 'out' / 'report.md'}")
    for name in report.REPORT_FILES:
        assert (tmp_path / "out" / name).is_file()


@pytest.mark.slow(reason="runs the self-test on mutants, one suite run each (25-45 s)")
def test_selftest_contract_on_two_mutants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """selftest.json as DESIGN.md promises it, on a cheap slice (the pinned-prompt capture
    check): both mutants caught, each diagnosed as its own bug class; the two runs side by
    side (--jobs 2), their rows in the order asked."""
    out = tmp_path / "st"
    code = cli.main(["selftest", "--report-dir", str(out), "--no-control", "--jobs", "2",
                     "--mutant", "ids_plus_one", "--mutant", "config_ids_ignored",
                     "--", "-k", "test_capture_pinned_prompts"])
    summary = json.loads((out / "selftest.json").read_text())
    rows = {m["name"]: m for m in summary["mutants"]}
    assert list(rows) == ["ids_plus_one", "config_ids_ignored"]
    assert code == 0 and summary["passed"], capsys.readouterr().out
    assert summary["mutation_score"] == 1.0 and summary["diagnosis_score"] == 1.0
    for name, kind, cause in [("ids_plus_one", "offset", "root cause: offset +1"),
                              ("config_ids_ignored", "ids_ignored", "root cause: ids ignored")]:
        row = rows[name]
        assert row["caught"] and row["diagnosis_correct"] and row["expected_diagnosis_kind"] == kind
        assert row["bug_class"] and row["failed_checks"] and 0 < row["diagnosis_share"] <= 1
        assert cause in row["diagnosis"], row["diagnosis"]


@pytest.mark.slow(reason="runs the self-test on mutants, one suite run each (25-45 s)")
def test_selftest_counts_a_drawn_ids_mutant_only_when_the_layer_id_check_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """zoo:slots_sorted is exact on every bundle draft: the fixed-draft capture check passes it,
    and its `caught_by` makes the selftest call it missed until test_layer_ids.py fails it."""
    fixed = tmp_path / "fixed"
    code = cli.main(["selftest", "--report-dir", str(fixed), "--no-control", "--mutant", "slots_sorted",
                     "--", "-k", "test_capture_pinned_prompts"])
    row = json.loads((fixed / "selftest.json").read_text())["mutants"][0]
    assert code == 1 and not row["caught"] and row["caught_by"] == "test_layer_ids.py::"
    drawn = tmp_path / "drawn"
    code = cli.main(["selftest", "--report-dir", str(drawn), "--no-control", "--mutant", "slots_sorted",
                     "--", "-k", "test_observed_convention_as_declared"])
    row = json.loads((drawn / "selftest.json").read_text())["mutants"][0]
    assert code == 0 and row["caught"] and row["diagnosis_correct"], capsys.readouterr().out
    assert all(c.startswith("test_layer_ids.py::") for c in row["failed_checks"])


def test_selftest_does_not_score_a_mutant_whose_bug_is_none_in_the_dtype(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """aux_rounded_bf16 rounds the aux states through bf16: inside a bf16 engine that changes
    nothing, so in a bf16 selftest it is named as not run, never scored as missed."""
    code = cli.main(["selftest", "--report-dir", str(tmp_path / "st"), "--no-control",
                     "--dtype", "bfloat16", "--mutant", "aux_rounded_bf16"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "zoo:aux_rounded_bf16" in out and "not run: not a bug in bfloat16" in out
    assert "no mutant applies in bfloat16" in err


def test_golden_build_on_cuda_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """--device cuda where torch sees no GPU is refused before any training."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal cannot be shown here")
    assert cli.main(["golden", "build", "--out", "x", "--device", "cuda"]) == 2
    assert "torch sees no CUDA device here; pass --device cpu" in _one_line_error(capsys)


def test_exit_3_names_the_place_in_the_suite(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A bug of the suite (exit 3) says where in the suite's own code it happened, so the
    one line is a bug report without a traceback."""
    from harness.core.tolerances import tolerance_for

    monkeypatch.setattr(cli, "cmd_table", lambda args, extra: tolerance_for("int4"))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    assert cli.main(["conformance-table", "x.json"]) == 3
    line = _one_line_error(capsys)
    assert "while running `conformance-table` in harness/core/tolerances.py:" in line
    assert "(tolerance_for)" in line and "report it" in line


def test_a_suite_module_that_does_not_collect_is_exit_3_not_ctrl_c(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """pytest gives "interrupted" (its exit code 2) both to Ctrl-C and to modules that fail to
    collect. The latter is a broken install or a suite bug: exit 3 naming the module, not 130
    "interrupted (Ctrl-C)". Provoked as CI met it: another module of the same name already
    imported, so suites/test_canary.py does not import ("import file mismatch")."""
    import types

    other = types.ModuleType("test_canary")
    other.__file__ = str(tmp_path / "elsewhere" / "test_canary.py")
    monkeypatch.setitem(sys.modules, "test_canary", other)
    out = tmp_path / "out"
    code = cli.main(["run", "--report-dir", str(out), "-k", "test_draft_config", "--", "-q",
                     "-p", "no:cacheprovider"])
    err = capsys.readouterr().err
    assert code == 3, (code, err[-2000:])
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: pytest could not collect") and "test_canary.py" in line, line
    assert "Ctrl-C" not in err and not (out / "report.json").exists()
