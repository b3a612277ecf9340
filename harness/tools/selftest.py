"""The self-test's two halves that are not the CLI: one suite run in a fresh interpreter, and
the score of a mutant's report (caught, and named exactly). `eagle3-conformance selftest`
(harness.cli) validates its arguments, runs the control and the mutants side by side with
`run_suite`, scores each with `score_mutant` and writes selftest.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def declared(entry: Any, attr: str) -> Any:
    """A zoo entry's declared attribute, on the entry or else on its class (None: neither)."""
    from harness.run.registry import _mutant_class

    for obj in (entry, _mutant_class(entry)):
        value = getattr(obj, attr, None)
        if value is not None:
            return value
    return None


def mutant_field(entry: Any, name: str, attr: str) -> str | None:
    """A zoo entry's declared attribute (on the entry or on its class), as text."""
    value = declared(entry, attr)
    if value is not None:
        return str(value)
    return None if attr != "name" else name


# What a suite run may take before the self-test stops it, in seconds. The engine calls of a
# run have their own deadlines (harness.run.timeouts); this bounds what those cannot: a hang that
# holds the GIL, a hang outside an engine call. The slowest runs measured are the full suite
# against the reference (about 5 min on the 2-core CPU machine) and zoo:capture_hangs (about
# 10 min under the old fixed first-call allowance); an hour is six times that.
RUN_LIMIT_S = 3600.0
TIMED_OUT = 124  # the exit status `timeout(1)` gives a command it stopped


def run_suite(engine: str, bundle: Path, out: Path, profile: str, extra: Sequence[str],
              run_flags: Sequence[str] = (), limit_s: float | None = RUN_LIMIT_S) -> int:
    """One suite run in a fresh interpreter: a mutant that crashes, leaks threads or poisons a
    module-level cache cannot affect the next one. run_flags: run options forwarded as given
    (--dtype, --device). A run past `limit_s` (None: no limit) is killed with its process
    group, said so in its run.log, and returns TIMED_OUT: it did not run, it is not scored."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "harness.cli", "run", "--engine", engine, "--bundle", str(bundle),
           "--report-dir", str(out), "--profile", profile, *run_flags,
           # mutants are the in-process reference on a tiny bundle: calls take seconds at most,
           # so a quarter of the default deadlines catches zoo:capture_hangs in minutes (its
           # first call's start-up allowance follows the measured construction,
           # harness.run.timeouts). A tenth was too tight
           # where runs share a loaded machine (--jobs): 36-token generations of correct
           # mutants took more than 7.8 s at five processes on two cores and read as hangs;
           # half made capture_hangs alone take over 25 min
           *(["--engine-timeout-scale", "0.25"] if engine.startswith("zoo:") else []),
           "--", "-q", "-p", "no:cacheprovider", *extra]
    with (out / "run.log").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            log.write(f"\nthe self-test stopped this run after {limit_s:g} s (its limit, "
                      f"--run-timeout): no verdict\n")
            return TIMED_OUT
        except BaseException:  # Ctrl-C: no run outlives the self-test
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen) -> None:
    """The run and every process it started (an engine's workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def score_mutant(name: str, entry: Any, code: int, report: dict[str, Any] | None,
                 report_dir: Path) -> dict[str, Any]:
    """One mutant's row of selftest.json: caught (the verdict is nonconformant and a check
    failed, the one it names in `caught_by` if it names one) and diagnosed exactly (every
    diagnosis in the report is the expected kind, not one of several)."""
    expected = mutant_field(entry, name, "expected_diagnosis_kind")
    result: dict[str, Any] = {"name": name, "bug_class": mutant_field(entry, name, "bug_class"),
                              "expected_diagnosis_kind": expected, "caught": False,
                              "diagnosis_correct": False, "failed_checks": [],
                              "diagnosis": None, "diagnosis_kinds": [], "diagnosis_share": 0.0,
                              "report_dir": str(report_dir)}
    if report is None or code not in (0, 1):
        result["error"] = f"the run ended with exit code {code} and no report; see run.log"
        return result
    diags = report.get("diagnoses", [])
    by_draft = declared(entry, "expected_kind_by_draft") or {}
    right = [d.get("kind") == by_draft.get(d.get("draft"), expected) for d in diags]
    match = next((d for d in diags if d.get("kind") == expected), None)
    failed = [c["id"] for c in report["checks"] if c["status"] in ("failed", "error", "xfail")]
    # a check must have failed: a mutant that merely could not run is not caught; a mutant
    # naming the check that must catch it (`caught_by`) needs that one to fail
    caught_by = mutant_field(entry, name, "caught_by")
    result.update(
        caught=report["summary"]["verdict"] == "nonconformant"
        and any(caught_by is None or c.startswith(caught_by) for c in failed),
        caught_by=caught_by,
        diagnosis_correct=bool(diags) and all(right),
        failed_checks=failed,
        diagnosis_kinds=sorted({str(d.get("kind")) for d in diags}),
        # how much of the evidence names the bug: 1.0 when no check blamed anything else
        diagnosis_share=round(sum(right) / len(diags), 3)
        if diags else 0.0,
        diagnosis=(match or (diags[0] if diags else {})).get("message"))
    return result


# A finished run's record, beside its report: what the run was (its key) and how it ended. With
# `selftest --resume` a run whose record holds the same key is scored from its report instead of
# run again, so a self-test longer than one sitting (the bf16 self-test on a 2-core CPU: ~2 h)
# can be interrupted and continued, or split over sittings, without a stale verdict: the key
# holds a digest of the suite's and the harness' own sources, so any change to them reruns.
RUN_RECORD = "selftest_run.json"
_DIGESTED = ("*.py", "*.txt", "*.json")


def source_digest(*roots: Path) -> str:
    """sha256 over the suite's and the harness' sources (path and bytes of every file the runs
    import or read: .py, xfail lists, schemas), in a fixed order."""
    h = hashlib.sha256()
    for root in roots:
        files = sorted({f for pattern in _DIGESTED for f in root.rglob(pattern)
                        if "__pycache__" not in f.parts})
        for f in files:
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def run_key(engine: str, bundle: Path, profile: str, extra: Sequence[str],
            run_flags: Sequence[str], digest: str) -> dict[str, Any]:
    """What decides a run's verdict, as the record stores it: the engine, the bundle's manifest
    digest, the profile, every forwarded flag, the sources' digest and the interpreter's torch."""
    import torch

    manifest = bundle / "manifest.json"
    return {"format_version": 1, "engine": engine,
            "bundle_manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()
            if manifest.is_file() else None,
            "profile": profile, "run_flags": list(run_flags), "pytest_args": list(extra),
            "sources_sha256": digest, "python": sys.version.split()[0], "torch": torch.__version__}


def write_run_record(out: Path, key: dict[str, Any], code: int) -> None:
    """The record of a run that ended (exit code included), written after its report."""
    (out / RUN_RECORD).write_text(json.dumps({"key": key, "exit_code": code}, indent=2) + "\n",
                                  encoding="utf-8")


def reusable_exit_code(out: Path, key: dict[str, Any]) -> int | None:
    """The exit code of an earlier run in `out` with the same key that reached a verdict (exit
    0 or 1, its report.json there), else None: it must run again. A record that does not parse
    is no record."""
    try:
        record = json.loads((out / RUN_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    code = record.get("exit_code")
    return code if code in (0, 1) and (out / "report.json").is_file() else None
