"""Per-step costs of the reference engine with the target over two processes (transformers'
tensor parallelism, gloo on the CPU) against the whole target in one process: the four costs
of the throughput suite's cost model (harness/engines/step_costs.py: plain decode step, verify
of k + 1 tokens, draft step, draft feed) and a speculative and a plain greedy run's wall time,
on the committed bundle (issue #38).

    python benchmarks/placement_step_costs.py --out placement_step_costs.json

launches `--worker` itself: once as one process, once under torchrun with two; each process
runs one OpenMP thread (oversubscribed threads on a shared CPU spin: a speculative run measured
0.3 s on one thread and 19 s on two busy cores), so the placement uses two cores and the single
process one. Per-step figures are the minimum over `--repeats` (harness.engines.step_costs);
rank 0's are reported (every rank runs the same SPMD program and waits for the others in each
all-reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 32


def worker(out: Path, single: bool, repeats: int) -> None:
    import torch

    from harness.engines.step_costs import measure_step_costs
    from harness.golden.bundle import load_bundle
    from harness.golden.paths import default_bundle_path
    from harness.models.placement import TENSOR_PARALLEL, rank, world_size
    from harness.tools.placement_probe import DRAFT, build

    bundle = load_bundle(default_bundle_path(), verify_hashes=False)
    t0 = time.perf_counter()
    _, engine = build(bundle, None if single else TENSOR_PARALLEL)
    load_s = time.perf_counter() - t0
    prompt = max(bundle.prompts(), key=len)
    spec = bundle.draft(DRAFT)
    k = spec.num_draft_tokens
    costs = measure_step_costs(engine, prompt, k, acceptance_length=2.0, repeats=repeats)
    runs = {}
    for mode, speculative in (("greedy", False), ("speculative", True)):
        engine.generate([prompt], 4, speculative)  # warm-up
        t0 = time.perf_counter()
        engine.generate([prompt], NEW_TOKENS, speculative)
        runs[f"{mode}_tok_per_s"] = NEW_TOKENS / (time.perf_counter() - t0)
    engine.close()
    record = {"world_size": world_size(), "rank": rank(), "threads": torch.get_num_threads(),
              "load_s": load_s, "prefix_tokens": len(prompt), "num_draft_tokens": k,
              "step_costs_s": {key: value for key, value in asdict(costs).items()
                               if key in ("plain_step", "verify", "draft_step", "draft_feed")},
              **runs}
    if rank() == 0:
        out.write_text(json.dumps(record, indent=2) + "\n")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def launch(out: Path, repeats: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    me = [str(Path(__file__).resolve()), "--worker", "--repeats", str(repeats)]
    single, placed = out.with_suffix(".single.json"), out.with_suffix(".tp2.json")
    subprocess.run([sys.executable, *me, "--single", "--out", str(single)], env=env, check=True, cwd=ROOT)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    *me, "--out", str(placed)], env=env, check=True, cwd=ROOT)
    figures = {"single": json.loads(single.read_text()), "tensor_parallel_2": json.loads(placed.read_text())}
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{'':22}{'1 process':>12}{'TP 2 (gloo)':>14}{'ratio':>8}")
    rows = [(f"{name} (ms)", figures["single"]["step_costs_s"][name] * 1e3,
             figures["tensor_parallel_2"]["step_costs_s"][name] * 1e3)
            for name in ("plain_step", "verify", "draft_step", "draft_feed")]
    rows += [(name, figures["single"][name], figures["tensor_parallel_2"][name])
             for name in ("greedy_tok_per_s", "speculative_tok_per_s", "load_s")]
    for name, a, b in rows:
        print(f"{name:22}{a:12.2f}{b:14.2f}{b / a:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.single, args.repeats)
    else:
        launch(args.out, args.repeats)


if __name__ == "__main__":
    main()
