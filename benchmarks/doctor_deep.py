"""`doctor` on a deep target: what each step costs at the motivating user's depth (61 layers).

The issue asks that weight inference "stay cheap at 61 layers": 62 boundaries and 3 slots make
37820 combinations, so past `EXHAUSTIVE_LIMIT` the coordinate search runs instead. This builds
a 61-layer target of the bundle's shape (DeepSeek-V3, MLA + MoE, hidden 128; random weights)
and a 3-slot draft (random weights, SpecForge ids [1, 29, 57]) in a scratch folder, runs the
whole doctor on them through the reference engine on `--device`, and records the wall time of
each step (from the doctor's own progress lines), how many candidates the search scored, and
the verdict. Both models are untrained, so the honest inference is "ambiguous" and the doctor
falls back to the config's ids read in `--convention`; the figure of interest is the cost.

`--shape motivating` (GPU) takes instead the GPU tier's 61-layer target at hidden 1024 with 64
routed experts (`harness.models.presets.motivating_depth_config`, ~3B parameters, saved to disk
in fp32 as a user's checkpoint would be) and a draft sized for it.

    python benchmarks/doctor_deep.py --device cpu --out /tmp/doctor_deep_cpu.json
    python benchmarks/doctor_deep.py --device cuda --out /tmp/doctor_deep_cuda.json
    python benchmarks/doctor_deep.py --device cuda --shape motivating --dtype bfloat16 --out /tmp/deep.json
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from harness.models.draft import DraftConfig, Eagle3Draft
from harness.models.presets import build_target_on, motivating_depth_config, random_draft
from harness.models.target import build_target, target_config_dict
from harness.tools.doctor import run_doctor

IDS = (1, 29, 57)


def build_motivating(root: Path, device: str) -> tuple[Path, Path]:
    """The GPU tier's 61-layer target and a draft sized for it, saved as a user would have them."""
    cfg = motivating_depth_config()
    build_target_on(cfg, 0, device, torch.float32).save_pretrained(root / "target", safe_serialization=True)
    random_draft(cfg, IDS, 1, device, torch.float32).save(root / "draft")
    return root / "target", root / "draft"


def build(root: Path, layers: int) -> tuple[Path, Path]:
    """A `layers`-deep target and a 3-slot draft, saved as a user would have them."""
    target = build_target(target_config_dict(num_layers=layers), seed=0)
    target.save_pretrained(root / "target", safe_serialization=True)
    torch.manual_seed(1)
    draft = Eagle3Draft(DraftConfig(vocab_size=512, draft_vocab_size=256, hidden_size=128,
                                    target_hidden_size=128, aux_layer_ids=IDS))
    draft.d2t.zero_()  # draft id i -> target id i
    draft.t2d.zero_()
    draft.t2d[:256] = True
    draft.save(root / "draft")
    return root / "target", root / "draft"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", choices=("tiny", "motivating"), default="tiny")
    ap.add_argument("--dtype", default=None, help="the engine's dtype (default: its own)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="doctor-deep-") as scratch:
        root = Path(scratch)
        t0 = time.perf_counter()
        target, draft = (build_motivating(root, args.device) if args.shape == "motivating"
                         else build(root, args.layers))
        layers = int(json.loads((target / "config.json").read_text())["num_hidden_layers"])
        built = time.perf_counter() - t0
        lines: list[tuple[float, str]] = []
        start = time.perf_counter()

        def say(line: str) -> None:
            lines.append((round(time.perf_counter() - start, 2), line))
            print(f"[{lines[-1][0]:7.2f} s] {line}", flush=True)

        code = run_doctor(target, draft, "reference", "specforge", args.device, args.dtype,
                          root / "report", say=say)
        total = time.perf_counter() - start
        report = json.loads((root / "report" / "report.json").read_text())
    steps = {line.split("]")[0] + "]": at for at, line in lines if line.startswith("[")}
    inference = report["doctor"]["inference"]
    result = {
        "shape": args.shape, "layers": layers, "device": args.device, "dtype": args.dtype,
        "ids": list(IDS), "combinations": math.comb(layers + 1, len(IDS)),
        "search": inference["search"], "candidates_scored": inference["candidates"],
        "inference": inference, "exit_code": code, "build_s": round(built, 2),
        "doctor_s": round(total, 2), "step_started_at_s": steps,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "transcript": [line for _, line in lines],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{layers} layers ({args.shape}) on {args.device}: doctor {total:.1f} s, {inference['search']} search "
          f"scored {inference['candidates']} of {result['combinations']} candidates, exit {code}")


if __name__ == "__main__":
    main()
