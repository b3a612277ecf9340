"""The reference engine on an accelerator: losslessness (chain and tree) and acceptance in
bf16 on CUDA, against the committed bundle. Prints and writes JSON figures.

    python benchmarks/gpu_reference.py --device cuda --dtype bfloat16 --out figures.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import load_bundle
from harness.golden.corpus import manifest_language, sample_batch
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.acceptance import heldout_prompts
from harness.judgement.assertions import divergence


def prompts_for(oracle: Oracle, count: int) -> list[list[int]]:
    """Pinned + held-out prompts, topped up with fresh corpus prompts to `count`."""
    out = oracle.pinned_prompts + heldout_prompts(oracle)
    extra = max(0, count - len(out))
    if extra:
        seed = int(oracle.bundle.manifest["seed"])
        out += sample_batch(manifest_language(oracle.bundle.manifest), extra, 20, torch.Generator().manual_seed(seed + 99)).tolist()
    return out[:count]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--drafts", nargs="*", default=None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bundle = load_bundle(args.bundle)
    oracle = Oracle(bundle)
    prompts = prompts_for(oracle, args.prompts)
    figures: dict = {"device": args.device, "dtype": args.dtype, "prompts": len(prompts),
                     "new_tokens": args.new_tokens, "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                     "drafts": {}}
    for draft in args.drafts or bundle.draft_names:
        row: dict = {}
        for mode, topk in (("chain", 1), ("tree", 2)):
            opts = EngineOptions(dtype=args.dtype, device=args.device, num_draft_tokens=4, tree_topk=topk,
                                 training_convention=bundle.draft(draft).convention)
            engine = ReferenceEngine(bundle.target_dir, bundle.draft_dir(draft), opts)
            t0 = time.perf_counter()
            plain = engine.generate(prompts, args.new_tokens, False)
            t1 = time.perf_counter()
            spec = engine.generate(prompts, args.new_tokens, True)
            t2 = time.perf_counter()
            exact = excused = 0
            failures = []
            for p, s, g in zip(prompts, spec.tokens, plain.tokens, strict=True):
                tie, failure = divergence(oracle, p, s, g, args.dtype, args.device)
                exact += s == g
                excused += tie
                if failure:
                    failures.append(failure)
            row[mode] = {
                "exact_match": exact, "excused_near_ties": excused, "unexcused": len(failures),
                "failures": failures[:3],
                "mean_acceptance_length": round(spec.acceptance.mean_acceptance_length, 4),
                "per_position": [round(r, 4) for r in spec.acceptance.per_position_rate],
                "plain_tok_s": round(len(prompts) * args.new_tokens / (t1 - t0), 1),
                "spec_tok_s": round(len(prompts) * args.new_tokens / (t2 - t1), 1),
            }
            engine.close()
            print(draft, mode, json.dumps(row[mode]), flush=True)
        row["golden_predicted"] = bundle.draft(draft).predicted_acceptance_length
        row["golden_measured_cpu_fp32"] = bundle.draft(draft).measured_acceptance_length
        figures["drafts"][draft] = row
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
