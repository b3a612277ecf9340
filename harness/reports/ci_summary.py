"""The run's verdict as a Markdown job summary: appended to `$GITHUB_STEP_SUMMARY` when GitHub
Actions sets it, so the verdict, the concerns and the first findings are on the job's page
without opening an artifact. Nothing is written where the variable is unset (a local run, or
GitLab, whose job page reads junit.xml instead: docs/CERTIFICATION.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV = "GITHUB_STEP_SUMMARY"
MAX_FINDINGS = 5
MARK = {"pass": "✅ pass", "fail": "❌ fail", "known_nonconformance": "⚠️ known nonconformance",
        "not_judged": "⏭️ not judged"}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_summary(report: Mapping[str, Any], cert: Mapping[str, Any]) -> str:
    """Markdown: the verdict line, one row per concern with its coverage, the first distinct
    findings (kind and message) and where the files are."""
    s = report["summary"]
    scope = cert.get("scope") or {}
    verdict = s["verdict"] + ("" if scope.get("complete") or s["verdict"] != "conformant"
                              else " (partial)")
    engine = cert["engine"]
    xfailed = f", {s['xfailed']} xfailed" if s.get("xfailed") else ""
    lines = [f"### EAGLE-3 conformance: **{verdict}**", "",
             f"engine `{engine['name']}` ({_cell(engine.get('version') or 'version unknown')}), "
             f"bundle `{cert['bundle'].get('name')}`"
             f"{' (pinned)' if cert['bundle'].get('pinned') else ' (not the pinned bundle)'}, "
             f"dtype `{cert['run'].get('dtype')}`, device `{cert['run'].get('device')}` — "
             f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped{xfailed}",
             "", f"> {_cell(s['verdict_reason'])}", "",
             "| concern | verdict | ran | skipped (why) |", "|---|---|---|---|"]
    for name, c in cert["concerns"].items():
        why = "; ".join(f"{len(k['checks'])}: {k['reason']}" for k in c["skipped"])
        lines.append(f"| {name} | {MARK.get(c['verdict'], c['verdict'])} | {c['ran']}/{c['checks']} "
                     f"| {_cell(why) or '-'} |")
    seen: list[tuple[str, str]] = []
    for d in report.get("diagnoses") or []:
        key = (str(d.get("kind")), str(d.get("message")))
        if key not in seen:
            seen.append(key)
    if seen:
        lines += ["", f"**Findings** ({len(seen)} distinct):", ""]
        lines += [f"- `{k}`: {_cell(m)[:300]}" for k, m in seen[:MAX_FINDINGS]]
        if len(seen) > MAX_FINDINGS:
            lines.append(f"- … {len(seen) - MAX_FINDINGS} more in report.html")
    if scope.get("deselected"):
        lines += ["", f"{scope['deselected']} check(s) deselected (`-k {scope.get('keyword')}`): "
                      f"the verdict covers the selection only."]
    lines += ["", "report.html, report.json, junit.xml, certificate.json and badge.svg are in the "
                  "job's artifacts; `eagle3-conformance verify-certificate certificate.json` "
                  "checks the certificate against its report.", ""]
    return "\n".join(lines)


def append_step_summary(report: Mapping[str, Any], cert: Mapping[str, Any],
                        environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append the summary to $GITHUB_STEP_SUMMARY if it is set; the path written, or None.
    A summary that cannot be written costs the run nothing (the report is the record)."""
    target = environ.get(ENV)
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8") as f:
            f.write(render_summary(report, cert) + "\n")
    except OSError:
        return None
    return Path(target)
