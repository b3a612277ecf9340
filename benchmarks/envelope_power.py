"""What the precision envelope still sees: the smallest wiring error the reduced-precision
capture judgement fails, per draft (issue #30, "power kept").

A wider envelope passes more correct engines and could hide small bugs. This measures how
small a bug it still catches, on the bundle's pinned prompts, with features a correct bf16
engine would hand over (the envelope's own `all-reduced` member, its widest) and one of two
wiring errors applied to every slot:

- `mix`: the slot holds (1 - a) * boundary b + a * boundary b-1: a = 1 is a whole boundary
  early (vLLM's offset on a SpecForge draft); small a is a partial-sum bug;
- `scale`: the slot holds (1 + e) * boundary b (a wrong norm weight, an epsilon, a cast).

For each draft it reports the smallest a and e (on a doubling grid) at which
`assert_capture_matches` fails every prompt judged together, the way the suite's pinned-prompt
check judges them. The member used as the engine is left out of the envelope it is judged by.

    python benchmarks/envelope_power.py --dtype bfloat16 --json power.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from harness.core.tolerances import DTYPES
from harness.golden.bundle import load_bundle
from harness.golden.features import TargetFeatures
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.assertions import CaptureContext, ConformanceFailure, assert_capture_matches
from harness.judgement.precision import is_reduced

GRID = [2.0 ** -k for k in range(12, -1, -1)]  # 1/4096 .. 1


def _slots(state: TargetFeatures, boundaries: list[int], how: str, amount: float) -> torch.Tensor:
    out = []
    for b in boundaries:
        own = state.boundaries[b]
        if how == "mix":
            other = state.boundaries[max(b - 1, 0)] if b > 0 else state.boundaries[1]
            out.append((1 - amount) * own + amount * other)
        else:
            out.append((1 + amount) * own)
    return torch.cat(out, -1)


def fails(oracle: Oracle, draft: str, dtype: str, member: str, how: str, amount: float,
          prompts: list[list[int]]) -> tuple[bool, str]:
    spec = oracle.spec(draft)
    envelopes = [oracle.envelope(p, dtype) for p in prompts]
    features = [_slots(e.members[member], list(spec.boundaries), how, amount) for e in envelopes]
    try:
        assert_capture_matches(
            CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype=dtype,
                           engine_name=f"{member}+{how}", draft=draft, check="envelope_power"),
            features=features, golden=[oracle.features(p) for p in prompts], prompts=prompts,
            envelopes=[e.without(member) for e in envelopes])
    except ConformanceFailure as failure:
        return True, failure.diagnoses[0].kind if failure.diagnoses else "?"
    return False, "ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--dtype", choices=[d for d in DTYPES if is_reduced(d)], default="bfloat16")
    ap.add_argument("--member", default="all-reduced", help="the envelope member used as the engine")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    oracle = Oracle(load_bundle(args.bundle, verify_hashes=False))
    if args.member not in [m.name for m in oracle.envelopes.members]:
        print(f"--member {args.member}: not a member here ({', '.join(m.name for m in oracle.envelopes.members)})",
              file=sys.stderr)
        return 2
    prompts = oracle.pinned_prompts
    figures: dict = {"dtype": args.dtype, "member": args.member, "prompts": len(prompts), "drafts": {}}
    start = time.perf_counter()
    print(f"{'draft':<20}{'control':>9}{'smallest mix':>14}{'kind':>22}{'smallest scale':>16}{'kind':>22}")
    for draft in oracle.bundle.manifest["drafts"]:
        control, _ = fails(oracle, draft, args.dtype, args.member, "scale", 0.0, prompts)
        row: dict = {"control_fails": control}
        for how in ("mix", "scale"):
            row[how] = None
            for amount in GRID:
                bad, kind = fails(oracle, draft, args.dtype, args.member, how, amount, prompts)
                if bad:
                    row[how], row[f"{how}_kind"] = amount, kind
                    break
        figures["drafts"][draft] = row
        print(f"{draft:<20}{'FAILS' if control else 'passes':>9}{row['mix'] or '-':>14}"
              f"{row.get('mix_kind', '-'):>22}{row['scale'] or '-':>16}{row.get('scale_kind', '-'):>22}",
              flush=True)
    figures["seconds"] = round(time.perf_counter() - start, 1)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    bad = any(r["control_fails"] or r["mix"] is None or r["mix"] > 1.0 for r in figures["drafts"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
