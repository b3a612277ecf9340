"""The report's Markdown: report.md of one run, and docs/CONFORMANCE.md (the table and the
observed layer-id conventions of several report.json files, with the hand-written sections
kept). Plain text from the report dict; the cell helpers are shared with harness.reports.report_html.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def _pin_note(bundle: dict[str, Any]) -> str:
    """" — unpinned" for a bundle that is not the committed, digest-pinned one (reports written
    before the field existed say nothing)."""
    return " — **unpinned** (not the committed, digest-pinned bundle)" if bundle.get("pinned") is False else ""


def _judged_on(report: dict[str, Any]) -> str:
    """The bundle line; doctor's report names its target and draft folders instead (it has no
    bundle, and used to print "bundle `—` sha256 `` (None)")."""
    doctor, b = report.get("doctor"), report.get("bundle") or {}
    if doctor:
        return f"- judged on: target `{doctor.get('target')}`, draft `{doctor.get('draft')}` (on disk, no bundle)"
    sha = f" sha256 `{b['sha256'][:16]}`" if b.get("sha256") else ""
    return f"- bundle: `{b.get('name') or '—'}`{sha} ({b.get('path')}){_pin_note(b)}"


def render_markdown(report: dict[str, Any]) -> str:
    e, s = report["engine"], report["summary"]
    out = [f"# EAGLE-3 conformance: {e['name']}", "",
           f"**Verdict: {s['verdict']}** — {s['verdict_reason']}", "",
           f"- engine: `{e['name']}` {e.get('version') or '(version unknown)'}",
           _judged_on(report),
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
                if d.get("addressee"):
                    out.append(f"  - addressed to: {d['addressee']}")
                if d.get("remedy"):
                    out.append(f"  - remedy {d['remedy']['result']}")
    return "\n".join(out) + "\n"


def _observed_markdown(observed: dict[str, Any] | None, level: str) -> list[str]:
    """The observed layer-id convention, per layout: rule, order, crashes, trainers served,
    the lists behind it, and each suggested fix re-served."""
    from harness.diagnosis.observed_convention import summary_line

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
        out += ["", "Each bundle draft's diagnosis with its remedy re-served where the remedy is a config "
                "change (a remedied copy of the draft: verified or unverified), else why it is unverified "
                "(and, where the engine declares its convention, the literal ids):", "",
                "| draft | diagnosis | ids re-served | layout | remedy | result |", "|---|---|---|---|---|---|"]
        out += [f"| {_md_cell(f['draft'])} | {_md_cell(f.get('diagnosis_kind') or '—')} | "
                f"{_md_cell(f.get('ids'))} | {_md_cell(f.get('layout') or '—')} | "
                f"{_md_cell(f.get('remedy') or '—')} | {_md_cell(f['result'])} |" for f in fixes]
    return out


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
                    f"on {_bundle_name(r)} ({_device(r)}, {r.get('dtype')})"]
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


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def report_shape_problem(data: Any) -> str | None:
    """What the table reads from a report.json, typed as it reads it; the first field that is
    not (one phrase), or None. A report of another shape is bad input, not a crash."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    for key in ("engine", "summary"):
        if not isinstance(data.get(key), dict):
            return f"{key!r} is {data.get(key)!r:.40}, not an object"
    for key in ("bundle", "metrics", "options", "observed_convention"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"{key!r} is {data[key]!r:.40}, not an object"
    s = data["summary"]
    if not isinstance(s.get("verdict"), str):
        return f"summary.verdict is {s.get('verdict')!r:.40}, not a string"
    for key in ("passed", "failed", "skipped"):
        if not _count(s.get(key)):
            return f"summary.{key} is {s.get(key)!r:.40}, not a count"
    if s.get("xfailed") is not None and not _count(s["xfailed"]):
        return f"summary.xfailed is {s['xfailed']!r:.40}, not a count"
    checks = data.get("checks")
    if not isinstance(checks, list):
        return f"'checks' is {checks!r:.40}, not a list"
    for c in checks:
        if not (isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("status"), str)):
            return f"a check entry is {c!r:.40}, not an object with a string id and status"
        diags = c.get("diagnoses", [])
        if not (isinstance(diags, list) and all(isinstance(d, dict) for d in diags)):
            return f"check {c['id']}: 'diagnoses' is {diags!r:.40}, not a list of objects"
    return None


def _bundle_name(report: dict[str, Any]) -> str:
    """The golden bundle a run judged against: one engine's rows differ by bundle (llama.cpp
    cannot capture on tiny-dsv3's architecture and can on tiny-qwen3moe's)."""
    return str((report.get("bundle") or {}).get("name") or "unknown")


def render_conformance_table(report_jsons: Sequence[Path]) -> str:
    """docs/CONFORMANCE.md: one section per engine, every check with its result and diagnosis.

    Deterministic in its inputs (sections by engine name, rows by check id; no clock), so the
    committed file changes only when a result does.
    """
    reports = []
    for path in report_jsons:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        problem = report_shape_problem(data)
        if problem:
            raise ValueError(f"{path} is not a report.json ({problem}); pass the report.json an "
                             f"`eagle3-conformance run` wrote")
        reports.append(data)
    reports.sort(key=lambda r: (str(r["engine"].get("name")), _bundle_name(r), _device(r),
                                str(r.get("dtype")), str(r.get("started"))))
    out = ["# Conformance results", "",
           "Generated by `eagle3-conformance conformance-table` from each engine's report.json. "
           "`xfail (known)` is a known nonconformance listed in `suites/xfails/<engine>.txt` (or "
           "`<engine>@<bundle>.txt` where a bundle has its own list).", ""]
    out += ["| engine | version | bundle | device | dtype | verdict | passed | failed | skipped | xfailed |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        s = r["summary"]
        out.append(f"| {_md_cell(r['engine'].get('name'))} | {_md_cell(r['engine'].get('version'))} | "
                   f"{_md_cell(_bundle_name(r))} | "
                   f"{_md_cell(_device(r))} | {_md_cell(r.get('dtype'))} | {s['verdict']} | "
                   f"{s['passed']} | {s['failed']} | {s['skipped']} | {s.get('xfailed', 0)} |")
    out += observed_conventions_markdown(reports)
    for r in reports:
        e, b = r["engine"], r.get("bundle") or {}
        metrics = r.get("metrics") or {}
        out += ["", f"## {e.get('name')} on {_bundle_name(r)} ({_device(r)}, {r.get('dtype')})", "",
                f"- version: {e.get('version') or 'unknown'}",
                f"- bundle: `{b.get('name')}` (manifest sha256 `{(b.get('sha256') or '')[:16]}`)"
                f"{_pin_note(b)}",
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
