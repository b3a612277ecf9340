"""The observed-convention check's verdict carries the causes of every list it disagrees with
(issue #31, item 4: no failing check without a cause). Its disagreements come from all lists
served in the run, the Hypothesis-drawn ones included, not only from its own probes; a drawn
list that held the final boundary as zeros was reported "unrecognised: no explanation fits"
by this check while the drawn check itself named final_boundary_missing (the CPU fp16 selftest
at 7ddbf38: final_missing, final_normed and embedding_dropped each lost their diagnosis share
there). The check now re-judges such lists from the run's cached capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow(reason="runs the layer-id checks on a zoo engine in a subprocess (~30 s)")
@pytest.mark.parametrize(("engine", "kind"), [("zoo:final_missing", "final_boundary_missing"),
                                              ("zoo:final_normed", "final_boundary_normed"),
                                              # a lone [0] list fits a shift and a dropped
                                              # embedding alike; the run's [0, 4] settles it
                                              ("zoo:embedding_dropped", "embedding_missing")])
def test_the_observed_convention_names_the_cause_of_drawn_lists(tmp_path: Path, engine: str,
                                                                 kind: str) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "suites/test_layer_ids.py",
         "-k", "drawn_layer_ids or observed_convention", "--engine", engine, "--dtype", "float16",
         "--report-dir", str(out)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=600, check=False)
    assert (out / "report.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    observed = [d for d in report["diagnoses"] if "observed_convention" in d["check"]]
    assert observed, f"the observed-convention check did not fail on {engine}: {proc.stdout[-2000:]}"
    assert {d["kind"] for d in observed} == {kind}, [(d["kind"], d["message"][:300]) for d in observed]
