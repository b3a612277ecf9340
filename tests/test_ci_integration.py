"""CI integration (issue #35): the GitHub Actions workflow a vendor copies is parsed and its
steps asserted (actionlint is not installed here; PyYAML is a dev dependency), and the
Markdown job summary goes to $GITHUB_STEP_SUMMARY when it is set, and nowhere when not."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

from harness.reports.ci_summary import render_summary
from harness.run.registry import resolve_engine

# What the inner sessions below import at their end (the engine class the report names, the
# certificate's modules), imported here first: an in-process pytester run drops the modules
# it imported, and transformers' model modules imported a second time in one process fail
# (torch's c10d TORCH_LIBRARY registered again), breaking every later test that serves a model.
resolve_engine("reference")
from harness import schemas  # noqa: E402, F401
from harness.golden import bundle  # noqa: E402, F401
from harness.reports import badge, certificate  # noqa: E402, F401

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "ci" / "github-actions.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(workflow: dict) -> list[dict]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


def test_workflow_runs_on_a_gpu_runner_on_every_trigger(workflow: dict) -> None:
    (job,) = workflow["jobs"].values()
    assert "gpu" in job["runs-on"]
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as True
    assert {"pull_request", "push", "schedule"} <= set(triggers)
    assert job["env"]["REPORT_DIR"] and job["env"]["ENGINE"] and job["env"]["BUNDLE_DIR"]


def test_workflow_steps_in_order(workflow: dict) -> None:
    steps = _steps(workflow)
    names = [s["name"] for s in steps]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    run = "\n".join(s.get("run", "") for s in steps)
    order = ["actions/checkout", "actions/setup-python", "actions/cache",
             "mikepenz/action-junit-report", "actions/upload-artifact"]
    assert [u for u in uses if u] == order, uses
    i_run = next(i for i, s in enumerate(steps) if "eagle3-conformance run " in s.get("run", ""))
    i_verify = next(i for i, s in enumerate(steps) if "verify-certificate" in s.get("run", ""))
    i_cache = uses.index("actions/cache")
    assert i_cache < i_run < i_verify < uses.index("actions/upload-artifact"), names
    assert "golden verify --pinned" in run and "--device cuda" in run
    assert '--report-dir "$REPORT_DIR"' in run and '--bundle "$BUNDLE_DIR"' in run


def test_workflow_caches_bundle_and_hypothesis_and_keeps_artifacts_always(workflow: dict) -> None:
    steps = _steps(workflow)
    env = next(iter(workflow["jobs"].values()))["env"]
    by_use = {s.get("uses", "").split("@")[0]: s for s in steps if s.get("uses")}
    cached = by_use["actions/cache"]["with"]["path"].split()
    assert ".hypothesis" in cached and env["BUNDLE_DIR"].split("/")[0] in cached
    artifact = by_use["actions/upload-artifact"]
    assert artifact["if"] == "always()" and artifact["with"]["path"].rstrip("/") == env["REPORT_DIR"]
    junit = by_use["mikepenz/action-junit-report"]
    assert junit["if"].startswith("always()")
    assert junit["with"]["report_paths"] == f"{env['REPORT_DIR']}/junit.xml"
    verify = next(s for s in steps if "verify-certificate" in s.get("run", ""))
    assert env["REPORT_DIR"] in verify["if"] and verify["if"].startswith("always()")


def test_actionlint_where_installed() -> None:
    """The structural asserts above stand in for it here; a vendor machine with actionlint
    checks the file's expressions too."""
    tool = shutil.which("actionlint")
    if tool is None:
        pytest.skip("actionlint is not installed; the workflow was parsed and its steps asserted")
    proc = subprocess.run([tool, str(WORKFLOW)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CHECKS = '''
from harness.reports.report import ConformanceFailure

def test_passes(report):
    pass

def test_fails(report):
    raise ConformanceFailure("fed one boundary early", [{"kind": "offset", "message": "fed [1, 3]"}])
'''


@pytest.fixture(autouse=True)
def _keep_hypothesis_profile():
    name = settings.get_current_profile_name()
    yield
    settings.load_profile(name)


@pytest.mark.parametrize("set_env", [True, False])
def test_step_summary_written_only_under_github_actions(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        set_env: bool) -> None:
    summary = pytester.path / "step_summary.md"
    summary.write_text("earlier step\n")
    if set_env:
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    else:
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makepyfile(test_checks=CHECKS)
    (pytester.path / "xf.txt").write_text("")
    pytester.runpytest_inprocess("--report-dir", str(pytester.path / "out"), "--xfails",
                                 str(pytester.path / "xf.txt"), "-p", "no:cacheprovider")
    text = summary.read_text()
    if not set_env:
        assert text == "earlier step\n"
        return
    assert text.startswith("earlier step\n### EAGLE-3 conformance: **nonconformant**")  # appended
    assert "| capture | ⏭️ not judged | 0/0 | - |" in text
    assert "| other | ❌ fail | 2/2 | - |" in text
    assert "- `offset`: fed [1, 3]" in text


def test_summary_folds_repeated_findings() -> None:
    report = json.loads((ROOT / "docs" / "figures" / "h200_seed14_ci_reference_bf16.json").read_text())
    report["diagnoses"] = [{"check": f"c{i}", "kind": "offset", "message": "same"} for i in range(7)]
    from harness.reports.certificate import build_certificate

    text = render_summary(report, build_certificate(report, json.dumps(report)))
    assert text.count("- `offset`: same") == 1 and "(1 distinct)" in text
    assert "### EAGLE-3 conformance: **conformant" in text and "| throughput | ✅ pass |" in text
