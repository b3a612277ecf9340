"""`selftest --resume`: a run that finished earlier with the same sources, bundle, profile and
flags is scored from its report instead of run again, and nothing else is. A self-test longer
than one sitting (bf16 on a 2-core CPU: ~2 h) can then be continued, and a stale verdict can
never be reused: each case below changes one part of the key, or breaks the record, and the run
must happen again. The suite runs are replaced by a writer of minimal reports (what a run
leaves: report.json, exit code); scoring and the records are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.tools import selftest

MUTANT = "ids_plus_one"  # expected diagnosis kind: offset


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each suite run writes the report a correct run of its engine would (control
    conformant, the mutant caught as `offset`) and is counted."""
    started: list[str] = []

    def run_suite(engine: str, bundle: Path, out: Path, profile: str, extra: object,
                  run_flags: object = (), limit_s: object = None) -> int:
        started.append(engine)
        out.mkdir(parents=True, exist_ok=True)
        caught = engine != "reference"
        report = {"summary": {"verdict": "nonconformant" if caught else "conformant"},
                  "checks": [{"id": "test_aux_capture.py::x", "status": "failed" if caught else "passed"}],
                  "diagnoses": [{"kind": "offset", "message": "offset +1"}] if caught else []}
        (out / "report.json").write_text(json.dumps(report))
        return 1 if caught else 0

    monkeypatch.setattr(selftest, "run_suite", run_suite)
    monkeypatch.setattr(cli, "_selftest_preflight", lambda *a: None)
    return started


def _selftest(root: Path, bundle: Path, *more: str) -> dict:
    code = cli.main(["selftest", "--report-dir", str(root), "--mutant", MUTANT,
                     "--bundle", str(bundle), *more])
    assert code == 0
    return json.loads((root / "selftest.json").read_text())


def test_resume_reuses_what_finished_with_the_same_key(runs: list[str], smoke_bundle: Path,
                                                       tmp_path: Path) -> None:
    first = _selftest(tmp_path / "st", smoke_bundle)
    assert sorted(runs) == ["reference", f"zoo:{MUTANT}"] and first["reused"] == []
    runs.clear()
    again = _selftest(tmp_path / "st", smoke_bundle, "--resume")
    assert runs == [], f"--resume ran {runs} again although their records match"
    assert again["reused"] == ["reference", f"zoo:{MUTANT}"]
    assert (again["mutation_score"], again["diagnosis_score"], again["control"]["verdict"]) == (
        1.0, 1.0, "conformant")


def test_without_resume_every_run_runs_again(runs: list[str], smoke_bundle: Path, tmp_path: Path) -> None:
    _selftest(tmp_path / "st", smoke_bundle)
    runs.clear()
    assert _selftest(tmp_path / "st", smoke_bundle)["reused"] == []
    assert sorted(runs) == ["reference", f"zoo:{MUTANT}"]


def test_changed_sources_run_again(runs: list[str], smoke_bundle: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _selftest(tmp_path / "st", smoke_bundle)
    runs.clear()
    monkeypatch.setattr(selftest, "source_digest", lambda *roots: "another checkout")
    assert _selftest(tmp_path / "st", smoke_bundle, "--resume")["reused"] == []
    assert sorted(runs) == ["reference", f"zoo:{MUTANT}"]


def test_other_flags_run_again(runs: list[str], smoke_bundle: Path, tmp_path: Path) -> None:
    _selftest(tmp_path / "st", smoke_bundle, "--profile", "dev")
    runs.clear()
    assert _selftest(tmp_path / "st", smoke_bundle, "--resume", "--profile", "ci")["reused"] == []
    assert sorted(runs) == ["reference", f"zoo:{MUTANT}"]


@pytest.mark.parametrize("damage", ["report gone", "record unreadable", "run crashed"])
def test_a_run_without_a_sound_record_runs_again(damage: str, runs: list[str], smoke_bundle: Path,
                                                 tmp_path: Path) -> None:
    root = tmp_path / "st"
    _selftest(root, smoke_bundle)
    out = root / "mutants" / MUTANT
    if damage == "report gone":
        (out / "report.json").unlink()
    elif damage == "record unreadable":
        (out / selftest.RUN_RECORD).write_text("{not json")
    else:  # a record of a run that reached no verdict is no result to reuse
        record = json.loads((out / selftest.RUN_RECORD).read_text())
        (out / selftest.RUN_RECORD).write_text(json.dumps({**record, "exit_code": 3}))
    runs.clear()
    assert _selftest(root, smoke_bundle, "--resume")["reused"] == ["reference"]
    assert runs == [f"zoo:{MUTANT}"]


def test_source_digest_sees_a_one_byte_change(tmp_path: Path) -> None:
    pkg = tmp_path / "harness"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    before = selftest.source_digest(pkg)
    (pkg / "a.py").write_text("x = 2\n")
    assert selftest.source_digest(pkg) != before
