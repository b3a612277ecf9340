"""report.html: the page a person reads at a glance, rendered from the report.json dict.

It leads with the finding, not the log: a draft x check matrix of outcomes, then one block per
root cause (a vLLM crash that fails eleven checks of one draft is one block, not eleven rows),
with the slots the engine fed against the slots training used, a slot-by-boundary heatmap of
what each slot resembles, the fix and whether re-serving it verified it; then acceptance per
draft position against the training prediction, the engine's observed layer-id convention, and
only then the per-check details.

One self-contained file (inline CSS and SVG, no script, no external asset): CI artefact stores
serve nothing else. Reads only report.json's keys (docs/DESIGN.md "Contracts"), so any report,
old or new, renders; a key a run did not produce leaves its section out.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from harness.report_md import _RESULT, _diag_text, _first_line

esc = html.escape

_CELL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
         "xfail": "xfail", "xpass": "xpass"}
ENGINE_WIDE = "engine-wide"

_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;max-width:90rem;color:#222}
table{border-collapse:collapse;margin:.6rem 0}
th,td{border:1px solid #ccc;padding:.3rem .45rem;text-align:left;vertical-align:top}
th{background:#f3f3f3} code,pre{font-family:ui-monospace,monospace;font-size:.9em}
pre{white-space:pre-wrap;background:#f8f8f8;padding:.5rem;margin:0}
.passed{background:#e9f7ec}.failed,.error{background:#fde8e8}.xfail{background:#fff4e0}
.skipped,.xpass{background:#f2f2f2}.none{background:#fff;color:#bbb}
.verdict-conformant{color:#1a7f37}.verdict-nonconformant{color:#c62828}.verdict-cannot{color:#8a6d00}
table.matrix th.check{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal;
 font-size:.8em;max-height:16rem;white-space:nowrap}
table.matrix td.cell{text-align:center;font-weight:600;font-size:.85em;min-width:2.6rem}
.root-cause{border:1px solid #d9a;border-left:6px solid #c62828;border-radius:4px;
 padding:.6rem 1rem;margin:1rem 0;background:#fffafa}
.root-cause.expected{border-left-color:#e0a000;background:#fffdf5}
.root-cause h3{margin:.2rem 0 .4rem}.muted{color:#666;font-size:.9em}
.fix-verified{color:#1a7f37;font-weight:600}.fix-unverified{color:#c62828;font-weight:600}
td.mismatch{background:#fde8e8}td.match{background:#e9f7ec}
svg text{font-family:system-ui,sans-serif}details{margin:.2rem 0}
"""


def _column(check: dict[str, Any]) -> str:
    """The matrix column of a check: its id without the draft parameter (one column per check
    function, whichever draft it ran for); an engine-wide check keeps its parameter."""
    cid = str(check["id"])
    draft = check.get("draft")
    suffix = f"[{draft}]"
    return cid[: -len(suffix)] if draft and cid.endswith(suffix) else cid


def _short(column: str) -> str:
    return column.split("::", 1)[-1].removeprefix("test_")


def matrix_html(checks: Sequence[dict[str, Any]], drafts: Sequence[str]) -> str:
    """Rows: drafts (then one engine-wide row); columns: checks; cells: the outcome."""
    columns = list(dict.fromkeys(_column(c) for c in checks))
    rows = list(dict.fromkeys([*drafts, *(c["draft"] for c in checks if c.get("draft"))]))
    if any(not c.get("draft") for c in checks):
        rows.append(ENGINE_WIDE)
    cell = {(c.get("draft") or ENGINE_WIDE, _column(c)): c for c in checks}
    head = "".join(f'<th class="check" title="{esc(col)}">{esc(_short(col))}</th>' for col in columns)
    body = []
    for row in rows:
        tds = []
        for col in columns:
            c = cell.get((row, col))
            if c is None:
                tds.append('<td class="cell none">—</td>')
                continue
            tip = _diag_text(c) or _RESULT.get(c["status"], c["status"])
            tds.append(f'<td class="cell {esc(c["status"])}" data-status="{esc(c["status"])}" '
                       f'title="{esc(tip)}">{esc(_CELL.get(c["status"], c["status"]))}</td>')
        body.append(f"<tr><th>{esc(row)}</th>{''.join(tds)}</tr>")
    return f'<table class="matrix"><tr><th>draft</th>{head}</tr>{"".join(body)}</table>'


# -- root causes -----------------------------------------------------------------------------


def root_causes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per root cause among the checks that did not pass: the checks it explains,
    the diagnosis, and the re-served fix recorded for that draft.

    A cause is (draft, diagnosis kind, what the engine fed against what training used, the
    suggested ids); messages that differ only in incidental detail (a crash's tensor shapes
    for another batch) stay one cause, its distinct wordings listed. A failed check without a
    diagnosis is its own cause, keyed by its message's first line."""
    fixes = {f.get("draft"): f for f in (report.get("observed_convention") or {}).get("fixes", [])}
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in report["checks"]:
        if c["status"] not in ("failed", "error", "xfail", "xpass"):
            continue
        diags = [d for d in c.get("diagnoses", []) if d.get("kind") != "ok"]
        if not diags:
            diags = [{"kind": "no diagnosis", "message": _first_line(c.get("message"), 400)}]
        for d in diags:
            draft = c.get("draft") or ENGINE_WIDE
            key = (draft, str(d.get("kind")), _cause_signature(d))
            g = groups.setdefault(key, {"draft": draft, "kind": key[1], "diagnosis": d,
                                        "checks": [], "statuses": set(), "messages": [],
                                        "fix": fixes.get(c.get("draft"))})
            g["checks"].append(c["id"])
            g["statuses"].add(c["status"])
            if str(d.get("message")) not in g["messages"]:
                g["messages"].append(str(d.get("message")))
    return list(groups.values())


def _cause_signature(d: dict[str, Any]) -> str:
    """What identifies a root cause apart from its wording; a diagnosis without slot data (a
    crash parsed from text, "no diagnosis") falls back to its message."""
    details = d.get("details") or {}
    fields = [d.get("engine_boundaries"), d.get("training_boundaries"),
              d.get("suggested_layer_ids"), details.get("fed_slots"), details.get("fc_slots")]
    if not any(f for f in fields):
        return str(d.get("message"))
    return json.dumps(fields)


def _slots_table(d: dict[str, Any]) -> str:
    fed, trained = d.get("engine_boundaries") or [], d.get("training_boundaries") or []
    details = d.get("details") or {}
    if not fed and not trained:
        if "fed_slots" in details or "fc_slots" in details:
            return (f'<p class="slots">The engine fed <strong>{esc(str(details.get("fed_slots")))}'
                    f'</strong> aux slot(s); the draft\'s fc takes <strong>'
                    f'{esc(str(details.get("fc_slots")))}</strong>.</p>')
        return ""
    width = max(len(fed), len(trained))
    cells_fed, cells_trained, head = [], [], []
    for s in range(width):
        f = fed[s] if s < len(fed) else "—"
        t = trained[s] if s < len(trained) else "—"
        cls = "match" if f == t else "mismatch"
        head.append(f"<th>slot {s}</th>")
        cells_fed.append(f'<td class="{cls}">{esc(str(f))}</td>')
        cells_trained.append(f"<td>{esc(str(t))}</td>")
    return (f'<table class="slots"><tr><th></th>{"".join(head)}</tr>'
            f'<tr><th>engine fed (boundary)</th>{"".join(cells_fed)}</tr>'
            f'<tr><th>training used (boundary)</th>{"".join(cells_trained)}</tr></table>')


def _heat_color(err: float, rtol: float) -> str:
    """Within tolerance: dark green (the same state). Beyond: blue fading linearly to white at
    an error of 1 (as far from the boundary as the boundary is from zero: nothing alike), so
    a neighbouring boundary reads darker than an unrelated one."""
    if not math.isfinite(err):
        return "#ffffff"
    if err <= rtol:
        return "#1a7f37"
    return f"hsl(212,65%,{35 + 62 * min(1.0, err):.0f}%)"


def heatmap_svg(d: dict[str, Any]) -> str:
    """Slot (row) by golden boundary (column) heatmap of the mean per-token relative error, from
    the capture diagnosis' details["slot_boundary_errors"]; the training boundary of each slot
    is outlined. Empty where the diagnosis carries no such rows (crashes, older reports)."""
    details = d.get("details") or {}
    rows = details.get("slot_boundary_errors") or []
    if not rows or not all(rows):
        return ""
    rtol = float(details.get("rtol") or 0.05)
    trained = d.get("training_boundaries") or []
    cols = len(rows[0])
    cw, ch, left, top = 46, 28, 132, 22
    w, h = left + cw * cols + 10, top + ch * len(rows) + 6
    out = [f'<svg class="heatmap" width="{w}" height="{h}" '
           f'role="img" aria-label="slot by boundary relative error">']
    for b in range(cols):
        label = "emb 0" if b == 0 else str(b)
        out.append(f'<text x="{left + cw * b + cw / 2}" y="{top - 6}" font-size="11" '
                   f'text-anchor="middle">{label}</text>')
    for s, row in enumerate(rows):
        y = top + ch * s
        want = trained[s] if s < len(trained) else None
        out.append(f'<text x="{left - 6}" y="{y + ch / 2 + 4}" font-size="11" text-anchor="end">'
                   f'slot {s} (trained {want if want is not None else "—"})</text>')
        for b, err in enumerate(row):
            e = float("inf") if err is None else float(err)
            fill = _heat_color(e, rtol)
            ink = "#fff" if e <= 0.45 else "#222"
            out.append(f'<rect class="heat-cell" x="{left + cw * b}" y="{y}" width="{cw}" '
                       f'height="{ch}" fill="{fill}" stroke="#fff"><title>slot {s} vs boundary '
                       f'{b}: mean relative error {e:.3g}</title></rect>')
            out.append(f'<text x="{left + cw * b + cw / 2}" y="{y + ch / 2 + 4}" font-size="10" '
                       f'text-anchor="middle" fill="{ink}">{e:.2f}</text>')
        if want is not None and 0 <= want < cols:
            out.append(f'<rect class="trained" x="{left + cw * want + 1}" y="{y + 1}" '
                       f'width="{cw - 2}" height="{ch - 2}" fill="none" stroke="#c62828" '
                       f'stroke-width="2.5"/>')
    out.append("</svg>")
    out.append(f'<p class="muted">Heatmap: columns are the golden boundaries (0 = embedding output), '
               f'cells the mean per-token relative error of the slot to each; green: within rtol '
               f'{rtol:g} (the same state); red outline: the boundary training used for the slot.</p>')
    return "".join(out)


def _fix_html(group: dict[str, Any]) -> str:
    d, fix = group["diagnosis"], group["fix"]
    parts = []
    if d.get("suggested_layer_ids") is not None:
        parts.append(f"<p><strong>Fix:</strong> set <code>eagle_aux_hidden_state_layer_ids</code> "
                     f"to <code>{esc(json.dumps(d['suggested_layer_ids']))}</code>"
                     f"{' for ' + esc(str(d['engine_convention'])) if d.get('engine_convention') else ''}.</p>")
    if fix is not None:
        result = str(fix.get("result", ""))
        ok = result.startswith("fix verified")
        cls = "fix-verified" if ok else "fix-unverified"
        parts.append(f'<p class="fix-result"><strong>Re-served</strong> with ids '
                     f'<code>{esc(json.dumps(fix.get("ids")))}</code> ({esc(str(fix.get("layout")))}): '
                     f'<span class="{cls}">{esc(result)}</span></p>')
    elif group["kind"] not in ("no diagnosis",):
        parts.append('<p class="muted">No fix was re-served for this draft in this run.</p>')
    return "".join(parts)


def root_causes_html(report: dict[str, Any]) -> str:
    groups = root_causes(report)
    if not groups:
        return "<p>No check failed: nothing to explain.</p>"
    out = []
    for g in groups:
        d = g["diagnosis"]
        expected = g["statuses"] <= {"xfail"}
        status = "known (xfail)" if expected else "/".join(sorted(g["statuses"]))
        checks = "".join(f"<li><code>{esc(c)}</code></li>" for c in g["checks"])
        others = "".join(f"<li>{esc(m)}</li>" for m in g["messages"][1:])
        variants = (f"<details><summary>{len(g['messages']) - 1} other wording(s) of this cause"
                    f"</summary><ul>{others}</ul></details>") if others else ""
        out.append(
            f'<div class="root-cause{" expected" if expected else ""}" data-kind="{esc(g["kind"])}">'
            f'<h3>{esc(g["kind"])} — {esc(g["draft"])} <span class="muted">({status}; '
            f'{len(g["checks"])} check(s))</span></h3>'
            f'<p class="message">{esc(str(d.get("message", "")))}</p>{_slots_table(d)}'
            f'{heatmap_svg(d)}{_fix_html(g)}{variants}'
            f'<details><summary>checks this explains</summary><ul>{checks}</ul></details></div>')
    return "".join(out)


# -- acceptance ------------------------------------------------------------------------------

_SERIES = (("acceptance_per_position", "engine", "#1f6feb"),
           ("golden_acceptance_per_position", "golden (reference)", "#8c8c8c"),
           ("predicted_acceptance_per_position", "training prediction", "#e0a000"))


def acceptance_svg(draft: str, metrics: dict[str, Any]) -> str:
    """Grouped bars per draft position: the share of rounds accepting at least k+1 drafted
    tokens, measured on the engine, simulated by the reference, and predicted by training's
    per-step accuracy (prod_{j<=k} acc_j)."""
    series = [(label, color, metrics[key]) for key, label, color in _SERIES
              if isinstance(metrics.get(key), list) and metrics[key]]
    if not series:
        return ""
    k = max(len(v) for _, _, v in series)
    bw, gap, left, top, plot_h = 16, 14, 36, 12, 120
    group = bw * len(series) + gap
    w, h = left + group * k + 150, top + plot_h + 34
    out = [f'<svg class="acceptance" data-draft="{esc(draft)}" '
           f'width="{w}" height="{h}" role="img" aria-label="acceptance per position, {esc(draft)}">']
    for frac in (0, 0.5, 1):
        y = top + plot_h * (1 - frac)
        out.append(f'<line x1="{left}" x2="{left + group * k}" y1="{y}" y2="{y}" stroke="#ddd"/>'
                   f'<text x="{left - 4}" y="{y + 4}" font-size="10" text-anchor="end">{frac:g}</text>')
    for pos in range(k):
        x0 = left + group * pos + gap / 2
        for i, (label, color, values) in enumerate(series):
            if pos >= len(values) or values[pos] is None:
                continue
            v = max(0.0, min(1.0, float(values[pos])))
            out.append(f'<rect x="{x0 + bw * i}" y="{top + plot_h * (1 - v)}" width="{bw - 2}" '
                       f'height="{plot_h * v}" fill="{color}"><title>{esc(label)}, position '
                       f'{pos + 1}: {v:.3f}</title></rect>')
        out.append(f'<text x="{x0 + bw * len(series) / 2}" y="{top + plot_h + 14}" font-size="10" '
                   f'text-anchor="middle">{pos + 1}</text>')
    for i, (label, color, _) in enumerate(series):
        y = top + 12 + 16 * i
        out.append(f'<rect x="{left + group * k + 10}" y="{y - 9}" width="10" height="10" '
                   f'fill="{color}"/><text x="{left + group * k + 24}" y="{y}" font-size="11">'
                   f'{esc(label)}</text>')
    out.append(f'<text x="{left}" y="{h - 4}" font-size="10">draft position</text></svg>')
    return "".join(out)


def acceptance_html(report: dict[str, Any]) -> str:
    blocks = []
    for draft, metrics in (report.get("metrics_by_draft") or {}).items():
        svg = acceptance_svg(draft, metrics or {})
        if svg:
            tau = metrics.get("acceptance_length")
            pred = metrics.get("predicted_acceptance_length")
            line = (f"<p class=\"muted\">acceptance length {esc(str(tau))} (training predicted "
                    f"{esc(str(pred))})</p>") if tau is not None else ""
            blocks.append(f"<div><h3>{esc(draft)}</h3>{line}{svg}</div>")
    if not blocks:
        return ""
    return ("<h2>Acceptance per draft position</h2><p class=\"muted\">Share of speculative "
            "rounds that accept at least k drafted tokens.</p>" + "".join(blocks))


# -- observed convention ---------------------------------------------------------------------


def convention_html(observed: dict[str, Any] | None) -> str:
    """The layer-id convention the engine showed, per config layout, and each fix re-served."""
    from harness.observed_convention import summary_line

    if not observed or not (observed.get("layouts") or observed.get("fixes")):
        return ""
    rows = []
    for layout, entry in (observed.get("layouts") or {}).items():
        serves = "".join(f"<li>{esc(t)}: {esc(str(v))}</li>"
                         for t, v in (entry.get("serves") or {}).items())
        lists = "; ".join(f"{c['ids']} → {c['slots'] if c.get('crash') is None else 'crash'}"
                          for c in entry.get("lists", []))
        crashes = "; ".join(f"{c['ids']}: {_first_line(c.get('error'), 160)}"
                            for c in entry.get("crashes", []))
        rows.append(f"<tr><td><code>{esc(layout)}</code></td><td>{esc(summary_line(entry))}</td>"
                    f"<td><ul>{serves}</ul></td><td><code>{esc(lists)}</code></td>"
                    f"<td>{esc(crashes) or '—'}</td></tr>")
    table = ('<table class="convention"><tr><th>config layout</th><th>rule</th><th>trainers '
             'served as trained</th><th>ids → slots served</th><th>crashes</th></tr>'
             + "".join(rows) + "</table>") if rows else ""
    fixes = observed.get("fixes") or []
    fix_rows = "".join(
        f"<tr><td>{esc(str(f['draft']))}</td><td><code>{esc(json.dumps(f.get('ids')))}</code></td>"
        f"<td>{esc(str(f.get('layout') or '—'))}</td><td class=\""
        f"{'fix-verified' if str(f.get('result', '')).startswith('fix verified') else 'fix-unverified'}\">"
        f"{esc(str(f.get('result')))}</td></tr>" for f in fixes)
    fix_table = ('<table class="fixes"><tr><th>draft</th><th>ids re-served</th><th>layout</th>'
                 f'<th>result</th></tr>{fix_rows}</table>') if fixes else ""
    return f"<h2>Observed layer-id convention</h2>{table}{fix_table}"


# -- the page --------------------------------------------------------------------------------


def details_html(report: dict[str, Any]) -> str:
    rows = []
    for c in report["checks"]:
        detail = ""
        if c["message"].strip() and c["status"] != "passed":
            detail += f"<details><summary>message</summary><pre>{esc(c['message'])}</pre></details>"
        for d in c["diagnoses"]:
            detail += (f"<details><summary>diagnosis: {esc(str(d.get('kind')))}</summary>"
                       f"<pre>{esc(json.dumps(d, indent=2))}</pre></details>")
        rows.append(f"<tr class=\"{esc(c['status'])}\"><td><code>{esc(c['id'])}</code></td>"
                    f"<td>{esc(c['draft'] or '—')}</td><td>{esc(_RESULT.get(c['status'], c['status']))}"
                    f"</td><td>{esc(_first_line(_diag_text(c), 160))}{detail}</td></tr>")
    return ("<h2>Details</h2><table class=\"details\"><tr><th>check</th><th>draft</th>"
            f"<th>result</th><th>diagnosis / reason</th></tr>{''.join(rows)}</table>")


def metrics_html(report: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td>{esc(d)}</td><td>{esc(k)}</td><td><code>{esc(json.dumps(v))}</code></td></tr>"
                   for d, m in (report.get("metrics_by_draft") or {}).items() for k, v in m.items())
    return (f"<h2>Metrics</h2><table><tr><th>draft</th><th>metric</th><th>value</th></tr>{rows}"
            "</table>") if rows else ""


def doctor_html(doctor: dict[str, Any] | None) -> str:
    """`doctor`'s finding (report.json key `doctor`): the config's ids, what the engine fed,
    what training used and where that came from, and the weight inference with its margin."""
    if not doctor:
        return ""
    inf = doctor.get("inference") or {}
    verdict = "ambiguous" if inf.get("ambiguous") else "decided"
    outcome = doctor.get("outcome") or {}
    fixed = ("no fix needed" if doctor.get("fed_boundaries") == doctor.get("trained_boundaries")
             else "verified by re-serving" if doctor.get("fix_verified") else "not verified")
    return (f'<div class="doctor"><h2>Draft on disk</h2><p class="doctor-outcome"><strong>'
            f'{esc(str(outcome.get("outcome", "")))}</strong> — {esc(str(outcome.get("evidence", "")))}'
            f'{(" What would separate them: " + esc(outcome["separate"])) if outcome.get("separate") else ""}'
            f'</p><table class="doctor"><tr><th>config ids '
            f'({esc(str(doctor.get("layout")))})</th><td><code>{esc(json.dumps(doctor.get("config_ids")))}'
            f'</code></td></tr><tr><th>engine fed (boundaries)</th><td><code>'
            f'{esc(json.dumps(doctor.get("fed_boundaries")))}</code></td></tr><tr><th>trained on '
            f'(boundaries)</th><td><code>{esc(json.dumps(doctor.get("trained_boundaries")))}</code> — '
            f'{esc(str(doctor.get("trained_source")))}</td></tr><tr><th>inferred from the weights'
            f'</th><td><code>{esc(json.dumps(inf.get("boundaries")))}</code> vs runner-up <code>'
            f'{esc(json.dumps(inf.get("runner_up")))}</code>: margin {esc(str(round(inf.get("margin") or 0, 4)))}'
            f', threshold {esc(str(round(inf.get("threshold") or 0, 4)))} on {esc(str(inf.get("tokens")))}'
            f' tokens — <strong>{verdict}</strong></td></tr><tr><th>fix</th><td>'
            f'{esc(fixed)}</td></tr></table></div>')


def coverage_html(cov: dict[str, Any] | None) -> str:
    """Which concerns were judged and which checks could not run: a pass never reads as
    covering a concern no check judged (issue #13)."""
    if not cov:
        return ""
    judged = esc(", ".join(cov.get("judged") or []) or "nothing")
    lines = "".join(f"<li>{esc(line)}</li>" for line in cov.get("lines") or [])
    return f'<h2>Coverage</h2><ul class="coverage"><li>judged: {judged}</li>{lines}</ul>'


def render_page(report: dict[str, Any], *, title: str | None = None, preface: str = "") -> str:
    """The whole page. `preface`: extra HTML after the verdict (doctor's "fed vs trained")."""
    e, b, s = report["engine"], report.get("bundle") or {}, report["summary"]
    title = title or f"EAGLE-3 conformance: {e['name']}"
    unavailable = f"<p>Engine unavailable: {esc(e['unavailable'])}</p>" if e.get("unavailable") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{esc(title)}</title><style>{_CSS}</style></head><body>
<h1>{esc(title)}</h1>
<p class="verdict verdict-{esc(s['verdict'])}"><strong>Verdict: {esc(s['verdict'])}</strong> —
{esc(s['verdict_reason'])}</p>
<p class="muted">engine <code>{esc(e['name'])}</code> {esc(e.get('version') or '(version unknown)')};
bundle <code>{esc(str(b.get('name')))}</code> sha256 <code>{esc((b.get('sha256') or '')[:16])}</code>;
dtype {esc(str(report.get('dtype')))}; started {esc(str(report.get('started')))},
{esc(str(report.get('duration_s')))} s; {s['passed']} passed, {s['failed']} failed,
{s['errors']} errors, {s['skipped']} skipped, {s['xfailed']} xfailed</p>{unavailable}{preface}
{coverage_html(s.get('coverage'))}{doctor_html(report.get('doctor'))}
<h2>Checks at a glance</h2>{matrix_html(report['checks'], report.get('drafts') or [])}
<h2>Root causes</h2>{root_causes_html(report)}
{acceptance_html(report)}{convention_html(report.get('observed_convention'))}
{details_html(report)}{metrics_html(report)}
</body></html>
"""
