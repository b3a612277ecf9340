"""Write an engine's xfails file from a report: every failed check becomes a strict expected
failure carrying its diagnosis, so CI stays green and any change in the engine shows.

    python scripts/xfails_from_report.py reports/vllm/report.json suites/xfails/vllm.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(report: Path, out: Path) -> None:
    data = json.loads(report.read_text())
    engine = data["engine"]
    lines = [f"# Known nonconformances of {engine['name']} {engine['version']} on bundle "
             f"{data['bundle']['name']} ({data['dtype']}), from its report; strict xfails.",
             "# Regenerate: python scripts/xfails_from_report.py REPORT.json THIS_FILE"]
    for check in data["checks"]:
        if check["status"] not in ("failed", "xfail"):
            continue
        diags = check.get("diagnoses") or []
        why = diags[0]["message"] if diags else (check.get("xfail_reason") or check["message"])
        why = " ".join(why.split())[:400]
        kind = diags[0]["kind"] if diags else "finding"
        lines.append(f"{check['id']}  # [{kind}] {why}")
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
