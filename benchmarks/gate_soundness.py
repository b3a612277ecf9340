"""Soundness of the throughput regression gate: it must not fail an unchanged engine and must
catch a real slowdown, every time.

The gate is pytest-benchmark's own: a baseline saved with `--benchmark-save`, later runs
compared with `--benchmark-compare=<baseline> --benchmark-compare-fail=min:<T>%` (the CI
recipe of docs/PERFORMANCE.md). This script saves one baseline of the speculative-decoding
benchmark (suites/test_throughput.py) for the reference engine, then runs the same gate
`--comparisons` times on the unchanged engine (each failure is a false alarm) and as many
times on `harness.engines.zoo:Slowdown20`, the reference with every verify round 20% slower
(each pass is a miss). In-process pytest sessions, so the figures measure the gate and not
interpreter start-up.

    python benchmarks/gate_soundness.py --device cpu --dtype float32 --comparisons 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
from pytest_benchmark.session import PerformanceRegression

from harness.golden.paths import suites_path

SLOW = "harness.engines.zoo:Slowdown20"


REGRESSED = "regressed"


def _session(engine: str, storage: Path, reports: Path, args: argparse.Namespace,
             extra: list[str]) -> int | str:
    """pytest's exit code, or REGRESSED where the compare-fail gate tripped (pytest-benchmark
    raises PerformanceRegression out of the session's finish)."""
    try:
        return _pytest(engine, storage, reports, args, extra)
    except PerformanceRegression:
        return REGRESSED


def _pytest(engine: str, storage: Path, reports: Path, args: argparse.Namespace,
            extra: list[str]) -> int:
    return int(pytest.main([
        str(suites_path() / "test_throughput.py"), "-q", "-p", "no:cacheprovider",
        "-k", "test_throughput_speculative", "--engine", engine, "--draft", args.draft,
        "--device", args.device, "--dtype", args.dtype, "--report-dir", str(reports),
        f"--benchmark-storage=file://{storage}", "--benchmark-columns=min,mean,stddev,rounds",
        "--benchmark-disable-gc", *extra]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft", default="specforge-default")
    ap.add_argument("--comparisons", type=int, default=20)
    ap.add_argument("--threshold", type=float, default=10.0,
                    help="percent by which the minimum may grow before the gate fails")
    ap.add_argument("--rounds", type=int, default=10, help="timed rounds per benchmark")
    ap.add_argument("--burn-in", type=int, default=2,
                    help="unsaved sessions before the baseline: the first sessions on a machine "
                         "run slow (clocks, caches) and would make a baseline nothing matches")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ["EAGLE3_THROUGHPUT_ROUNDS"] = str(args.rounds)
    gate = ["--benchmark-compare=0001", f"--benchmark-compare-fail=min:{args.threshold:g}%"]
    # inside the working directory: pytest-benchmark words its machine_info comparison with a
    # path relative to it, and crashes on storage elsewhere
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".gate_soundness_") as tmp:
        storage, reports = Path(tmp) / "storage", Path(tmp) / "reports"
        t0 = time.perf_counter()
        for _ in range(args.burn_in):
            _session("reference", storage, reports, args, [])
        if _session("reference", storage, reports, args, ["--benchmark-save=baseline"]) != 0:
            print("error: the baseline run failed; see its output above", file=sys.stderr)
            return 2
        unchanged = [_session("reference", storage, reports, args, gate)
                     for _ in range(args.comparisons)]
        slowed = [_session(SLOW, storage, reports, args, gate) for _ in range(args.comparisons)]
        wall = time.perf_counter() - t0
    figures = {"device": args.device, "dtype": args.dtype, "draft": args.draft,
               "threshold_pct": args.threshold, "rounds": args.rounds, "burn_in": args.burn_in,
               "comparisons": args.comparisons,
               "false_failures": sum(code != 0 for code in unchanged),
               "slowdown_caught": sum(code == REGRESSED for code in slowed),
               "unchanged_exit_codes": unchanged, "slowed_exit_codes": slowed,
               "wall_s": round(wall, 1)}
    print(json.dumps(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    sound = figures["false_failures"] == 0 and figures["slowdown_caught"] == args.comparisons
    return 0 if sound else 1


if __name__ == "__main__":
    sys.exit(main())
