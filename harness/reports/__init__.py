"""The record of a run and everything rendered from it: the `ReportCollector` checks write into
and the `ConformanceFailure` they raise (`report`), the check statuses read from pytest's phase
reports (`outcomes`), report.md and docs/CONFORMANCE.md (`report_md`), report.html and its
findings (`report_html`, `findings`), and what a run claims: certificate.json, badge.svg and the
CI job summary (`certificate`, `badge`, `ci_summary`).

Imported at every pytest start (through the plugin), so nothing here imports torch: diagnoses
are read by duck type. It judges nothing and runs nothing: the judgement and the run import it,
never the other way round."""
