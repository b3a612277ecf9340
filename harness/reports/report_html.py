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

from harness.reports.findings import fix_class, fold
from harness.reports.report_md import _RESULT, _diag_text, _first_line

esc = html.escape

_CELL = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip",
         "xfail": "xfail", "xpass": "xpass"}
ENGINE_WIDE = "engine-wide"

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1rem 2rem;max-width:120rem;color:#222}
h1{margin:.3rem 0 .6rem;font-size:1.5rem}
table{border-collapse:collapse;margin:.6rem 0}
.scroll{max-width:100%;overflow-x:auto}
code{overflow-wrap:anywhere} svg{max-width:100%;height:auto}
table.details td:first-child{max-width:32rem}
.summary{border:1px solid #ccc;border-radius:6px;padding:.7rem 1rem;margin:.4rem 0 1rem;
 background:#fafafa}
.summary .verdict{font-size:1.25rem;margin:.1rem 0 .5rem}
.summary dl{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1rem;margin:0}
.summary dt{font-weight:600}.summary dd{margin:0}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,36rem),1fr));gap:1rem}
.ok{color:#1a7f37;font-weight:600}.warn{color:#9a6700;font-weight:600}.bad{color:#c62828;font-weight:600}
th,td{border:1px solid #ccc;padding:.3rem .45rem;text-align:left;vertical-align:top}
th{background:#f3f3f3} code,pre{font-family:ui-monospace,monospace;font-size:.9em}
pre{white-space:pre-wrap;background:#f8f8f8;padding:.5rem;margin:0}
.passed{background:#e9f7ec}.failed,.error{background:#fde8e8}.xfail{background:#fff4e0}
.skipped,.xpass{background:#f2f2f2}.none{background:#fff;color:#bbb}
.verdict-conformant{color:#1a7f37}.verdict-nonconformant{color:#c62828}.verdict-cannot{color:#8a6d00}
table.matrix th.check{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:normal;
 font-size:.8em;max-height:16rem;white-space:nowrap}
table.matrix td.cell{text-align:center;font-weight:600;font-size:.8em;min-width:2.2rem;
 padding:.25rem .15rem}
table.matrix th.check{padding:.3rem .1rem}
.root-cause{border:1px solid #d9a;border-left:6px solid #c62828;border-radius:4px;
 padding:.6rem 1rem;margin:0;background:#fffafa;min-width:0}
.root-cause.expected{border-left-color:#e0a000;background:#fffdf5}
.root-cause h3{margin:.2rem 0 .4rem}.muted{color:#666;font-size:.9em}
.wirings .engine{fill:#1f6feb}.wirings .trained{fill:#1a7f37}.wirings .wrong{fill:#c62828}
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
        cls = fix_class(result)
        parts.append(f'<p class="fix-result"><strong>Re-served</strong> with ids '
                     f'<code>{esc(json.dumps(fix.get("ids")))}</code> ({esc(str(fix.get("layout")))}): '
                     f'<span class="{cls}">{esc(result)}</span></p>')
    elif group["kind"] not in ("no diagnosis",):
        parts.append('<p class="muted">No fix was re-served for this draft in this run.</p>')
    return "".join(parts)


def _cause_html(g: dict[str, Any]) -> str:
    """One draft's occurrence of a finding: its message, slots, heatmap and fix."""
    d = g["diagnosis"]
    others = "".join(f"<li>{esc(m)}</li>" for m in g["messages"][1:])
    variants = (f"<details><summary>{len(g['messages']) - 1} other wording(s) of this cause"
                f"</summary><ul>{others}</ul></details>") if others else ""
    return (f'<p class="message">{esc(str(d.get("message", "")))}</p>{_slots_table(d)}'
            f'{heatmap_svg(d)}{_fix_html(g)}{variants}')


def root_causes_html(report: dict[str, Any]) -> str:
    """One card per finding (harness.reports.findings.fold): shown in full for its first draft, the
    other drafts and every check it explains folded under it."""
    findings = fold(root_causes(report))
    if not findings:
        return "<p>No check failed: nothing to explain.</p>"
    out = []
    for f in findings:
        first, rest = f["occurrences"][0], f["occurrences"][1:]
        status = ("known nonconformance (xfail)" if f["expected"]
                  else "/".join(sorted(set().union(*(o["statuses"] for o in f["occurrences"])))))
        also = "".join(f'<details><summary>also in draft {esc(o["draft"])} ({len(o["checks"])} '
                       f'check(s))</summary>{_cause_html(o)}</details>' for o in rest)
        checks = "".join(f"<li><code>{esc(c)}</code></li>" for c in f["checks"])
        out.append(
            f'<div class="root-cause{" expected" if f["expected"] else ""}" data-kind="{esc(f["kind"])}" '
            f'data-occurrences="{len(f["checks"])}">'
            f'<h3>{esc(f["kind"])} <span class="muted">({status}; {len(f["checks"])} check(s) in '
            f'{len(f["drafts"])} draft(s): {esc(", ".join(f["drafts"]))})</span></h3>'
            f'<p class="who"><strong>Who acts:</strong> {esc(f["who"])}</p>'
            f'<p class="muted">draft {esc(first["draft"])}:</p>{_cause_html(first)}{also}'
            f'<details><summary>checks this explains</summary><ul>{checks}</ul></details></div>')
    return f'<div class="cards">{"".join(out)}</div>'


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
    from harness.diagnosis.observed_convention import summary_line

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
        f"<td>{esc(str(f.get('layout') or '—'))}</td><td class=\"{fix_class(str(f.get('result', '')))}\">"
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
    fixed = _doctor_fix(doctor)
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
            f' tokens — <strong>{verdict}</strong></td></tr><tr><th>fix</th><td '
            f'class="{"warn" if fixed == "not verified" else "ok"}">{esc(fixed)}</td></tr></table></div>')


def coverage_html(cov: dict[str, Any] | None) -> str:
    """Which concerns were judged and which checks could not run: a pass never reads as
    covering a concern no check judged (issue #13)."""
    if not cov:
        return ""
    judged = esc(", ".join(cov.get("judged") or []) or "nothing")
    lines = "".join(f"<li>{esc(line)}</li>" for line in cov.get("lines") or [])
    return f'<h2>Coverage</h2><ul class="coverage"><li>judged: {judged}</li>{lines}</ul>'


# -- summary, header, wirings ----------------------------------------------------------------


def _doctor_fix(doctor: dict[str, Any]) -> str:
    return ("no fix needed" if doctor.get("fed_boundaries") == doctor.get("trained_boundaries")
            else "verified by re-serving" if doctor.get("fix_verified") else "not verified")


def summary_html(report: dict[str, Any]) -> str:
    """The first thing on the page: the verdict, the cause, the fix and who acts on it, in
    a few lines a reader takes in without scrolling; everything below is the evidence."""
    s = report["summary"]
    findings = fold(root_causes(report))
    doctor = report.get("doctor")
    rows: list[tuple[str, str]] = []
    if findings:
        f = findings[0]
        first = f["occurrences"][0]
        d = first["diagnosis"]
        more = f" (+{len(findings) - 1} more finding(s) below)" if len(findings) > 1 else ""
        rows.append(("Cause", f"<code>{esc(f['kind'])}</code> in {len(f['checks'])} check(s), "
                              f"{len(f['drafts'])} draft(s): "
                              f"{esc(_first_line(str(d.get('message')), 260))}{esc(more)}"))
        fix = ""
        if d.get("suggested_layer_ids") is not None:
            fix = (f"set <code>eagle_aux_hidden_state_layer_ids</code> to "
                   f"<code>{esc(json.dumps(d['suggested_layer_ids']))}</code>")
        if first.get("fix") is not None:
            result = str(first["fix"].get("result", ""))
            fix += f'{"; " if fix else ""}<span class="{fix_class(result)}">{esc(result)}</span>'
        rows.append(("Fix", fix or '<span class="warn">no id list fixes this: the engine must '
                                   'change (details below)</span>'))
        rows.append(("Who acts", esc(f["who"])))
    elif doctor:
        fixed = _doctor_fix(doctor)
        rows.append(("Fix", f'<span class="{"warn" if fixed == "not verified" else "ok"}">'
                            f'{esc(fixed)}</span>'))
    elif s["verdict"] == "conformant":
        rows.append(("Fix", '<span class="ok">No fix needed</span>: every judged check passed'))
        rows.append(("Who acts", "nobody"))
    cov = s.get("coverage") or {}
    if cov:
        judged = ", ".join(cov.get("judged") or []) or "nothing"
        missing = (f"; not judged: {len(cov['lines'])} part(s), listed under Coverage"
                   if cov.get("lines") else "")
        rows.append(("Judged", esc(judged + missing)))
    rows.append(("Run", header_text(report)))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return (f'<section class="summary" id="summary"><p class="verdict verdict-{esc(s["verdict"])}">'
            f'<strong>Verdict: {esc(s["verdict"])}</strong> — {esc(s["verdict_reason"])}</p>'
            f'<dl>{dl}</dl></section>')


def header_text(report: dict[str, Any]) -> str:
    """Engine, what it was judged on (a bundle, or doctor's target and draft on disk), dtype,
    time and counts, as HTML; never "bundle None"."""
    e, b, s = report["engine"], report.get("bundle") or {}, report["summary"]
    doctor = report.get("doctor")
    if doctor:
        on = (f"target <code>{esc(str(doctor.get('target')))}</code>, draft "
              f"<code>{esc(str(doctor.get('draft')))}</code> (on disk, no bundle)")
    elif b.get("name") or b.get("sha256"):
        on = f"bundle <code>{esc(str(b.get('name') or b.get('path')))}</code>" + (
            f" sha256 <code>{esc(b['sha256'][:16])}</code>" if b.get("sha256") else "")
    else:
        on = "no bundle"
    return (f"engine <code>{esc(e['name'])}</code> {esc(e.get('version') or '(version unknown)')}; "
            f"{on}; dtype {esc(str(report.get('dtype')))}; started {esc(str(report.get('started')))}, "
            f"{esc(str(report.get('duration_s')))} s; {s['passed']} passed, {s['failed']} failed, "
            f"{s['errors']} errors, {s['skipped']} skipped, {s['xfailed']} xfailed")


def wirings_svg(draft: str, wirings: dict[str, Any], measured: float | None) -> str:
    """Acceptance length per wiring as a dot plot: the draft served as trained (green), under
    each wrong wiring of the manifest (red), and this engine's measured point (blue, with a
    line through every row), so a reader sees which wiring the engine's acceptance matches."""
    rows = [(str(w.get("what") or name), w.get("boundaries"), float(w["acceptance_length"]),
             "trained" if name == "served" else "wrong")
            for name, w in wirings.items() if isinstance(w, dict)
            and isinstance(w.get("acceptance_length"), (int, float))]
    rows.sort(key=lambda r: (r[3] != "trained", -r[2]))
    if not rows:
        return ""
    if measured is not None:
        rows.append(("this engine (measured)", None, float(measured), "engine"))
    lo, hi = 1.0, max(2.0, math.ceil(max(r[2] for r in rows) + 0.25))
    labels = [r[0] + (f" {r[1]}" if r[1] is not None else "") for r in rows]
    # room for the longest label at ~6.2 px a character (11 px sans-serif)
    left, right, top, rh, plot = 16 + int(6.2 * max(map(len, labels))), 30, 10, 24, 360
    w, h = left + plot + right, top + rh * len(rows) + 34

    def x(v: float) -> float:
        return left + plot * (min(max(v, lo), hi) - lo) / (hi - lo)

    bottom = top + rh * len(rows)
    out = [f'<svg class="wirings" data-draft="{esc(draft)}" viewBox="0 0 {w} {h}" width="{w}" '
           f'height="{h}" role="img" aria-label="acceptance by wiring, {esc(draft)}">']
    for t in range(int(lo), int(hi) + 1):
        out.append(f'<line x1="{x(t)}" x2="{x(t)}" y1="{top}" y2="{bottom}" stroke="#e3e3e3"/>'
                   f'<text x="{x(t)}" y="{bottom + 14}" font-size="10" text-anchor="middle">{t}</text>')
    if measured is not None:
        out.append(f'<line class="engine-line" x1="{x(measured)}" x2="{x(measured)}" y1="{top}" '
                   f'y2="{bottom}" stroke="#1f6feb" stroke-dasharray="4 3"/>')
    for i, (label, bounds, value, cls) in enumerate(rows):
        y = top + rh * i + rh / 2
        text = label + (f" {bounds}" if bounds is not None else "")
        out.append(f'<text x="{left - 8}" y="{y + 4}" font-size="11" text-anchor="end">'
                   f'{esc(text)}</text><circle class="{cls}" cx="{x(value)}" cy="{y}" r="6">'
                   f'<title>{esc(text)}: acceptance length {value:.2f}</title></circle>'
                   f'<text x="{x(value) + 9}" y="{y + 4}" font-size="10">{value:.2f}</text>')
    out.append(f'<text x="{left + plot / 2}" y="{h - 4}" font-size="10" text-anchor="middle">'
               f'acceptance length (tokens per verify round)</text></svg>')
    return "".join(out)


def wirings_html(report: dict[str, Any]) -> str:
    blocks = []
    for draft, wirings in (report.get("wirings") or {}).items():
        measured = ((report.get("metrics_by_draft") or {}).get(draft) or {}).get("acceptance_length")
        svg = wirings_svg(draft, wirings or {},
                          measured if isinstance(measured, (int, float)) else None)
        if svg:
            blocks.append(f"<div><h3>{esc(draft)}</h3>{svg}</div>")
    if not blocks:
        return ""
    return ('<h2>What a miswiring costs</h2><p class="muted">Acceptance length of each draft '
            'as trained and under each wrong wiring (measured when the bundle was built), and '
            "this engine's measured point: an engine whose point sits on a wrong wiring is fed "
            'that wiring.</p><div class="cards">' + "".join(blocks) + "</div>")


def render_page(report: dict[str, Any], *, title: str | None = None, preface: str = "") -> str:
    """The whole page, summary first. `preface`: extra HTML after the summary (doctor's
    "fed vs trained")."""
    e = report["engine"]
    title = title or f"EAGLE-3 conformance: {e['name']}"
    unavailable = f"<p>Engine unavailable: {esc(e['unavailable'])}</p>" if e.get("unavailable") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title><style>{_CSS}</style></head><body>
<h1>{esc(title)}</h1>
{summary_html(report)}{unavailable}{preface}
<h2>Checks at a glance</h2><div class="scroll">{matrix_html(report['checks'], report.get('drafts') or [])}</div>
<h2>Findings</h2>{root_causes_html(report)}
{wirings_html(report)}
{coverage_html(report['summary'].get('coverage'))}{doctor_html(report.get('doctor'))}
{acceptance_html(report)}{convention_html(report.get('observed_convention'))}
<div class="scroll">{details_html(report)}</div>{metrics_html(report)}
</body></html>
"""
