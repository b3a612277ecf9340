"""certificate.json, badge.svg and `verify-certificate`, on a real run of the reference engine
over the committed bundle (three checks, ~10 s), and the JSON Schemas on real documents.

The run is real (no mock engine): the certificate must summarise a report a run wrote, and
verification must fail for each way a published certificate can disagree with its evidence:
an edited verdict, another run's report, another bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import cli
from harness.golden.paths import default_bundle_path
from harness.golden.pins import PINNED_MANIFESTS
from harness.reports import certificate as cert_mod
from harness.reports.badge import COLOURS, GREY, PARTIAL, render_badge
from harness.schemas import problems

ROOT = Path(__file__).resolve().parents[1]
CHECKS = "test_draft_config or test_fc_output or test_capture_pinned"


def _cli(*argv: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout, check=False)


def _verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """verify-certificate in this process (it imports no torch and runs no pytest)."""
    capsys.readouterr()
    code = cli.main(["verify-certificate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cert") / "out"
    proc = _cli("run", "--engine", "reference", "--draft", "single-aux", "--profile", "dev",
                "--report-dir", str(out), "-k", CHECKS, "--", "-q", "-p", "no:cacheprovider")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.slow(reason="runs the suite in a subprocess (~10 s)")
def test_every_run_writes_a_certificate_of_its_report(run_dir: Path) -> None:
    cert, report = _load(run_dir / "certificate.json"), _load(run_dir / "report.json")
    assert problems(cert, "certificate") == [] and problems(report, "report") == []
    assert cert["report"]["sha256"] == hashlib.sha256((run_dir / "report.json").read_bytes()).hexdigest()
    assert cert["verdict"] == report["summary"]["verdict"] == "conformant"
    engine = cert["engine"]
    assert engine["name"] == "reference" and engine["class"] == "harness.engines.reference:ReferenceEngine"
    assert Path(engine["adapter_path"]) == ROOT / "harness" / "engines" / "reference.py"
    assert engine["adapter_sha256"] == hashlib.sha256(Path(engine["adapter_path"]).read_bytes()).hexdigest()
    assert cert["bundle"]["name"] == "tiny-dsv3" and cert["bundle"]["pinned"] is True
    assert cert["bundle"]["sha256"] == PINNED_MANIFESTS["tiny-dsv3"]
    assert cert["run"]["dtype"] == "float32" and cert["run"]["device"] == "cpu"
    assert cert["run"]["profile"] == "dev" and cert["run"]["drafts"] == ["single-aux"]
    assert cert["environment"]["torch"] and "cuda" in cert["environment"]
    assert cert["suite"]["version"] and len(cert["suite"]["commit"] or "x" * 40) >= 40
    concerns = cert["concerns"]
    assert list(concerns)[:7] == list(cert_mod.ENGINE_CONCERNS)
    assert concerns["capture"]["verdict"] == "pass" and concerns["fc"]["verdict"] == "pass"
    assert concerns["config"]["verdict"] == "pass"  # the lint: kept out of the engine's concerns
    assert concerns["vocab"]["verdict"] == "not_judged" and concerns["vocab"]["ran"] == 0
    # a -k run certifies a subset and says so: badge amber, scope partial
    assert cert["scope"]["complete"] is False and cert["scope"]["deselected"] > 0
    assert cert["scope"]["keyword"] == CHECKS
    assert "vocab" in cert["scope"]["not_judged"]
    badge = (run_dir / "badge.svg").read_text()
    assert "conformant (partial)" in badge and PARTIAL in badge and badge.startswith("<svg")


def test_verify_certificate_accepts_the_run_and_its_bundle(run_dir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _verify(capsys, str(run_dir / "certificate.json"),
                             "--bundle", str(default_bundle_path()))
    assert code == 0, out + err
    assert "verifies: conformant (partial:" in out and "bundle files verified" in out


def _copy_run(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    return dest


def test_an_edited_verdict_does_not_verify(run_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy_run(run_dir, tmp_path / "edited")
    cert = _load(out / "certificate.json")
    cert["concerns"]["vocab"].update(verdict="pass", ran=1, passed=1)  # claims a check never run
    (out / "certificate.json").write_text(json.dumps(cert))
    code, stdout, err = _verify(capsys, str(out / "certificate.json"))
    assert code == 1, stdout + err
    assert "MISMATCH concerns.vocab.verdict" in stdout and "does NOT verify" in stdout


def test_another_report_does_not_verify(run_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy_run(run_dir, tmp_path / "other")
    report = _load(out / "report.json")
    report["duration_s"] += 1.0  # one field of another run: a different digest
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    code, stdout, err = _verify(capsys, str(out / "certificate.json"))
    assert code == 1 and "report sha256" in stdout, stdout + err


def test_another_bundle_does_not_verify(run_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "bundle"
    other.mkdir()
    manifest = (default_bundle_path() / "manifest.json").read_text()
    (other / "manifest.json").write_text(manifest.replace('"seed"', '"seed" ', 1))
    code, out, err = _verify(capsys, str(run_dir / "certificate.json"), "--bundle", str(other))
    assert code == 1 and "not the bundle the run used" in out, out + err


@pytest.mark.parametrize("case", ["not_json", "not_a_certificate", "no_report", "no_bundle"])
def test_bad_input_is_one_line_exit_2(case: str, run_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = _copy_run(run_dir, tmp_path / case)
    args = [str(out / "certificate.json")]
    if case == "not_json":
        (out / "certificate.json").write_text("{")
    elif case == "not_a_certificate":
        (out / "certificate.json").write_text(json.dumps({"verdict": "conformant"}))
    elif case == "no_report":
        (out / "report.json").unlink()
    else:
        args += ["--bundle", str(tmp_path / "missing")]
    code, stdout, err = _verify(capsys, *args)
    assert code == 2, stdout + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


# -- concerns, from report checks ------------------------------------------------------------


def _check(module: str, status: str, message: str = "") -> dict[str, Any]:
    return {"id": f"test_{module}.py::test_x[d]", "status": status, "message": message}


def _concerns(*checks: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return cert_mod.concern_verdicts({"checks": list(checks), "summary": {"coverage": {"not_run": []}}})


def test_concern_verdicts_never_pass_what_did_not_run() -> None:
    c = _concerns(_check("aux_capture", "passed"), _check("layer_ids", "failed"),
                  _check("fc_projection", "passed"), _check("fc_projection", "xfail"),
                  _check("vocab_mapping", "skipped", "no capability"),
                  _check("throughput", "passed"), _check("throughput", "skipped", "xdist"),
                  _check("my_extra", "passed"))
    assert c["capture"]["verdict"] == "fail"  # one failure outweighs a pass
    assert c["fc"]["verdict"] == "known_nonconformance"
    assert c["vocab"]["verdict"] == "not_judged"
    assert c["vocab"]["skipped"] == [{"reason": "no capability", "checks": ["test_vocab_mapping.py::test_x[d]"]}]
    assert c["throughput"]["verdict"] == "pass" and c["throughput"]["complete"] is False
    assert c["other"]["verdict"] == "pass"  # an unknown module is counted, never dropped
    assert c["batching"] == {**c["batching"], "verdict": "not_judged", "checks": 0}


def test_badge_colours_mean_what_they_say() -> None:
    base = {"engine": {"name": "e"}, "run": {"dtype": "bfloat16"}, "bundle": {"name": "b", "pinned": True}}
    assert COLOURS["conformant"] in render_badge({**base, "verdict": "conformant", "scope": {"complete": True}})
    assert PARTIAL in render_badge({**base, "verdict": "conformant", "scope": {"complete": False}})
    assert COLOURS["nonconformant"] in render_badge({**base, "verdict": "nonconformant", "scope": {}})
    assert GREY in render_badge({**base, "verdict": None})
    assert "(unpinned)" in render_badge({**base, "verdict": "conformant",
                                         "bundle": {"name": "b", "pinned": False}})


# -- schemas ---------------------------------------------------------------------------------

FIGURES = sorted((ROOT / "docs" / "figures").glob("*reference*.json"))


@pytest.mark.parametrize("path", [p for p in FIGURES if '"format_version"' in p.read_text()[:40]],
                         ids=lambda p: p.name)
def test_committed_reports_validate(path: Path) -> None:
    """Reports of earlier full runs (CPU nightly, H200 ci) are valid format_version 1."""
    assert problems(_load(path), "report") == []


def test_broken_documents_fail_validation(run_dir: Path) -> None:
    report = _load(run_dir / "report.json")
    assert problems(report, "report") == []
    broken = json.loads(json.dumps(report))
    del broken["summary"]["verdict"]
    broken["checks"][0]["status"] = "sort of"
    found = problems(broken, "report")
    assert any("summary" in p and "verdict" in p for p in found), found
    assert any(p.startswith("checks/0/status") for p in found), found
    cert = _load(run_dir / "certificate.json")
    bad = json.loads(json.dumps(cert))
    bad["report"]["sha256"] = "abc"
    assert any(p.startswith("report/sha256") for p in problems(bad, "certificate"))
    # conformant overall while a concern failed: the schema itself refuses it
    bad = json.loads(json.dumps(cert))
    bad["concerns"]["fc"].update(verdict="fail", failed=1)
    assert any(p.startswith("concerns/fc/verdict") for p in problems(bad, "certificate"))
    assert problems({**cert, "certificate_version": 9}, "certificate")[0].startswith("certificate_version 9")


def test_schemas_are_package_data() -> None:
    """Shipped in the package (pyproject package-data), found through importlib.resources."""
    from harness.schemas import schema

    for kind in ("report", "certificate"):
        s = schema(kind)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["$id"].endswith(":v1")
    assert '"harness.schemas" = ["*.json"]' in (ROOT / "pyproject.toml").read_text()
