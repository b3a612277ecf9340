"""On the committed bundle acceptance tells the wiring (issue #10), even where acceptance
counters are all an engine reports and it runs in bf16: the suite's acceptance checks and the
canary, run through `counters_only_adapters` (a server's view: no capture, no traces), pass the
reference engine and fail an engine that feeds every slot one boundary early on at least three
drafts, having cost it at least 25% of held-out acceptance there.

Each run is a real `eagle3-conformance run` in its own interpreter; the verdict and the figures
are read from its report.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = "test_acceptance_meets_training_prediction or test_canary_acceptance"
PREDICTION = "test_acceptance_meets_training_prediction"
pytestmark = pytest.mark.slow


@cache
def _report(engine: str) -> dict[str, Any]:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"acceptance-truth-{os.getpid()}-{engine.split(':')[1]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env.pop("CI", None)
    run = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--engine", engine, "--dtype", "bfloat16",
         "--report-dir", str(out), "--profile", "dev", "-k", CHECKS, "--", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, env=env, timeout=1500, check=False, cwd=ROOT)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def _statuses(report: dict[str, Any], check: str) -> dict[str, str]:
    return {c["draft"]: c["status"] for c in report["checks"] if check in c["id"]}


def _heldout(report: dict[str, Any]) -> dict[str, float]:
    return {d: float(m["heldout_acceptance_length"]) for d, m in report["metrics_by_draft"].items()
            if "heldout_acceptance_length" in m}


def test_counters_only_reference_passes_in_bf16() -> None:
    report = _report("counters_only_adapters:Reference")
    drafts = set(report["drafts"])
    assert _statuses(report, PREDICTION) == dict.fromkeys(drafts, "passed"), report["checks"]
    assert _statuses(report, "test_canary_acceptance") == dict.fromkeys(drafts, "passed"), report["checks"]
    assert report["summary"]["verdict"] == "conformant"


def test_one_boundary_early_costs_a_quarter_and_fails_through_counters_in_bf16() -> None:
    ref, bad = _report("counters_only_adapters:Reference"), _report("counters_only_adapters:SlotsOneEarly")
    served, early = _heldout(ref), _heldout(bad)
    loss = {d: round(1 - early[d] / served[d], 3) for d in served}
    failed = [d for d, s in _statuses(bad, PREDICTION).items() if s == "failed"]
    print(f"held-out acceptance in bf16, served {served}, every slot one early {early}, loss {loss}")
    assert sum(v >= 0.25 for v in loss.values()) >= 3, loss
    assert len(failed) >= 3 and all(loss[d] > 0 for d in failed), (failed, loss)
    # the canary, counters alone: every draft (the mutant moves a slot of each one)
    assert set(_statuses(bad, "test_canary_acceptance").values()) == {"failed"}, bad["checks"]
    assert bad["summary"]["verdict"] == "nonconformant"
