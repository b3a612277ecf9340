"""The suite under pytest-xdist: the same verdict, the same checks with the same statuses and
diagnoses, and one report, as a serial run; and one worker per GPU where there are several."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.reports.report import CheckResult, ReportCollector
from harness.run.distributed import merge_payload, worker_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("device", "index", "count", "want"), [
    ("cuda", 0, 4, "cuda:0"), ("cuda", 5, 4, "cuda:1"), ("cuda:2", 5, 4, "cuda:2"),
    ("cpu", 3, 4, "cpu"), ("cuda", None, 4, "cuda"), ("cuda", 1, 0, "cuda")])
def test_one_worker_per_gpu(device: str, index: int | None, count: int, want: str) -> None:
    assert worker_device(device, index, count) == want


def test_merge_keeps_the_run_over_the_collected_copy() -> None:
    controller = ReportCollector()
    ran = CheckResult("a", "n::a", status="failed", message="boom", ran=True)
    idle = CheckResult("a", "n::a")
    for payload_checks in ([ran], [idle]):
        merge_payload(controller, {"checks": [c.__dict__ for c in payload_checks],
                                   "metrics": {"d": {"k": 1}}, "engine_version": "v",
                                   "engine_unavailable": None,
                                   "engine_constructions": {"d": 1}})
    assert controller.checks["a"].status == "failed" and controller.checks["a"].ran
    assert controller.engine_constructions == {"d": 2} and controller.metrics == {"d": {"k": 1}}


def _run(tmp: Path, name: str, *extra: str) -> dict:
    out = tmp / name
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "suites"),
           "--engine", "zoo:ids_minus_one", "--draft", "specforge-default", "--report-dir",
           str(out), "-k", "capture or draft_config or fc_", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "1"}
    subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert (out / "junit.xml").is_file() and (out / "report.md").is_file()
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow(reason="runs the suite twice, serially and under pytest-xdist (~50 s)")
def test_two_workers_give_the_serial_verdict_and_one_report(tmp_path: Path) -> None:
    """A mutant, so that failures and diagnoses have to travel from the workers."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (the dev extra has it)")
    serial, parallel = _run(tmp_path, "serial"), _run(tmp_path, "parallel", "-n", "2")
    assert parallel["summary"] == serial["summary"]
    assert serial["summary"]["verdict"] == "nonconformant"

    def outcome(report: dict) -> dict:
        return {c["id"]: (c["status"], sorted(d["kind"] for d in c["diagnoses"]))
                for c in report["checks"]}

    assert outcome(parallel) == outcome(serial)
