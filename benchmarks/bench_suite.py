"""Benchmark: the `ci`-profile conformance run against one engine, end to end.

Prints wall time and the share spent outside engine calls (the suite's own overhead:
oracle, diagnosis, Hypothesis, reporting). Engine calls are timed by wrapping the adapter
class's methods in-process, so nothing in the suite changes for the measurement.

    python benchmarks/bench_suite.py --engine reference [--budget 120]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.golden.paths import suites_path
from harness.run.registry import resolve_engine


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="reference")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; exit 1 above it")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args, rest = ap.parse_known_args()
    os.environ.setdefault("CI", "1")  # the ci Hypothesis profile
    cls = resolve_engine(args.engine)
    spent = {"engine_s": 0.0, "calls": 0}
    for name in ("__init__", "capture", "generate"):
        original = getattr(cls, name)

        @functools.wraps(original)
        def timed(*a, __f=original, **kw):
            t0 = time.perf_counter()
            try:
                return __f(*a, **kw)
            finally:
                spent["engine_s"] += time.perf_counter() - t0
                spent["calls"] += 1

        setattr(cls, name, timed)
    with tempfile.TemporaryDirectory() as reports:
        t0 = time.perf_counter()
        code = pytest.main([str(suites_path()), "-q", "-p", "no:cacheprovider", "--engine", args.engine,
                            "--hypothesis-profile", "ci", "--report-dir", reports, *rest])
        wall = time.perf_counter() - t0
        verdict = json.loads((Path(reports) / "report.json").read_text())["summary"]["verdict"]
    figures = {"engine": args.engine, "wall_s": round(wall, 2), "engine_s": round(spent["engine_s"], 2),
               "outside_engine_share": round(1 - spent["engine_s"] / wall, 3),
               "engine_calls": spent["calls"], "pytest_exit": int(code), "verdict": verdict}
    print(json.dumps(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if wall <= args.budget else 1


if __name__ == "__main__":
    sys.exit(main())
