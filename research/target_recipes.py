"""Which target recipe trains on every machine? Train the golden target under recipe variants
(the decorrelation penalty's start, ramp and weight, the learning rate, the seed) and report
what the builder judges a target by: final LM loss, held-out accuracy against a bigram
table's, the mean adjacent-boundary centred cos^2 (the penalty's own value on held-out text:
small means a one-boundary shift changes what a draft sees), and the fraction of greedy
continuations that loop (`greedy_loop_fraction`).

Why: the committed recipe (penalty at weight 1 from the first step, 600 steps) trains on the
machine that built the bundle but stalls from scratch on an AMD EPYC (loss 4.763, accuracy
0.042), and the variants tried there first either stall or loop (docs/research/bundle_levers.md).
Each variant runs in its own single-threaded process (the builder's thread count), so a
many-core host measures many variants at once:

    PYTHONPATH=. python research/target_recipes.py --variants committed ramp100 start25 \
        --seeds 0 1 --workers 2 --out /tmp/recipes.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "committed": {},
    "ramp50": {"decorrelate_ramp": 50},
    "ramp100": {"decorrelate_ramp": 100},
    "ramp150": {"decorrelate_ramp": 150},
    "start25": {"decorrelate_start": 25},
    "start50": {"decorrelate_start": 50},
    "start25ramp50": {"decorrelate_start": 25, "decorrelate_ramp": 50},
    "start100": {"decorrelate_start": 100},
    "lr2e-3": {"lr": 2e-3},
    "lr1.5e-3": {"lr": 1.5e-3},
    "lr2e-3ramp50": {"lr": 2e-3, "decorrelate_ramp": 50},
    "w0.5": {"decorrelate": 0.5},
}


def measure(variant: str, seed: int, steps: int) -> dict[str, Any]:
    """Train one variant's target in this process and measure it."""
    import torch

    from harness.golden.builder import REGEN_PROMPT_LEN
    from harness.golden.corpus import make_language
    from harness.golden.training import (
        _boundary_hooks,
        bigram_accuracy,
        decorrelation_penalty,
        greedy_loop_fraction,
        heldout_batch,
        train_target_model,
    )
    from harness.models.target import build_target, target_config_dict

    torch.set_num_threads(1)
    t0 = time.time()
    torch.manual_seed(seed)
    lang = make_language(seed)
    model = build_target(target_config_dict(vocab_size=lang.vocab_size), seed)
    kwargs = {"decorrelate": 1.0, **VARIANTS[variant]}
    loss, acc = train_target_model(model, lang, seed, steps, **kwargs)
    store: list[torch.Tensor] = []
    hooks = _boundary_hooks(model, store)
    with torch.no_grad():
        model(input_ids=heldout_batch(lang, seed))
        cos2 = float(decorrelation_penalty(store))
    for h in hooks:
        h.remove()
    return {"variant": variant, "recipe": kwargs, "seed": seed, "steps": steps,
            "final_loss": round(loss, 4), "heldout_accuracy": round(acc, 4),
            "bigram_accuracy": round(bigram_accuracy(lang, seed), 4),
            "adjacent_cos2": round(cos2, 4),
            "greedy_loop_fraction": greedy_loop_fraction(model, lang, seed, REGEN_PROMPT_LEN),
            "seconds": round(time.time() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--one", nargs=2, metavar=("VARIANT", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.steps)))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def child(job: tuple[str, int]) -> dict[str, Any]:
        cmd = [sys.executable, __file__, "--one", job[0], str(job[1]), "--steps", str(args.steps),
               "--out", "-"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            return {"variant": job[0], "seed": job[1], "error": done.stderr[-2000:]}
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        return row

    jobs = [(v, s) for v in args.variants for s in args.seeds]
    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(child, jobs))
    import torch
    import transformers

    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cpu": _cpu_name(),
                                    "versions": {"torch": torch.__version__,
                                                 "transformers": transformers.__version__},
                                    "rows": rows}, indent=1) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
