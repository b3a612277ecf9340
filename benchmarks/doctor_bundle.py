"""`doctor` on the committed bundle: the time to a verdict for the cases a user meets.

Each case is one `eagle3-conformance doctor` process (the reference engine, the CPU, no option
but the ones named), timed from the outside: wall time and the CPU time of the process (a
shared machine inflates the first, not the second). Cases: the seed case (embed-first's config
rewritten as three layers [1, 3, 5]) bare and told `--convention specforge`; the same draft
configured right ([-1, 3, 5]); final-aux as shipped, whose last slot the weights barely use,
so the doctor spends its whole budget of sampled text (the worst case).

    python benchmarks/doctor_bundle.py --out docs/figures/doctor_bundle_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.golden.paths import default_bundle_path
from harness.tools.doctor import NESTED, with_ids

BUNDLE = default_bundle_path()


def _cases(root: Path) -> list[tuple[str, Path, list[str]]]:
    seed = with_ids(BUNDLE / "draft-embed-first", [1, 3, 5], NESTED, root / "seed")
    right = with_ids(BUNDLE / "draft-embed-first", [-1, 3, 5], NESTED, root / "right")
    return [("seed case, no options", seed, []),
            ("seed case, --convention specforge", seed, ["--convention", "specforge"]),
            ("seed draft configured right", right, []),
            ("final-aux as shipped (whole budget)", BUNDLE / "draft-final-aux", [])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="doctor-bundle-") as scratch:
        root = Path(scratch)
        for name, draft, extra in _cases(root):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "harness.cli", "doctor", "--target",
                                  str(BUNDLE / "target"), "--draft", str(draft), "--quiet", *extra],
                                 capture_output=True, text=True, env={**os.environ})
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            verdict = next((line for line in run.stdout.splitlines() if line.startswith("doctor: ")), "")
            results.append({"case": name, "exit_code": run.returncode, "wall_s": round(wall, 1),
                            "cpu_s": round(cpu, 1), "outcome": verdict[:200]})
            print(f"{name}: exit {run.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU — {verdict[:120]}",
                  flush=True)
    load = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cores": os.cpu_count(), "load_average_after": load,
                                    "cases": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
