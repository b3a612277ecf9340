"""`selftest --dtype bfloat16` runs the control and every mutant in bf16 (the judgement under
test is the reduced-precision one) and says so in selftest.json; a mutant must stay caught
with its own diagnosis there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli


@pytest.mark.slow(reason="runs the self-test, one suite run per mutant (~55 s)")
def test_selftest_forwards_dtype_to_every_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "st"
    code = cli.main(["selftest", "--report-dir", str(out), "--dtype", "bfloat16", "--mutant",
                     "final_normed", "--mutant", "moe_capture_skipped", "--", "-k",
                     "test_capture_pinned_prompts"])
    summary = json.loads((out / "selftest.json").read_text())
    assert code == 0 and summary["passed"], capsys.readouterr().out
    assert summary["dtype"] == "bfloat16" and summary["control"]["verdict"] == "conformant"
    for row in summary["mutants"]:
        report = json.loads((Path(row["report_dir"]) / "report.json").read_text())
        assert report["dtype"] == "bfloat16"
        assert row["caught"] and row["diagnosis_correct"], row
    control = json.loads((out / "control" / "report.json").read_text())
    assert control["dtype"] == "bfloat16"


def test_selftest_rejects_an_unknown_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["selftest", "--report-dir", "/tmp/x", "--dtype", "int8"])
    err = capsys.readouterr().err
    assert code == 2 and "argument --dtype: invalid choice: 'int8'" in err and len(err.splitlines()) == 1
