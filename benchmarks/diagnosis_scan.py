"""Every capture mutant of the bug zoo on every bundle draft, judged on the pinned batch the way
the capture check judges it (one batch, each prompt alone as the batch evidence), in a chosen
dtype: the kind named against the kind expected. A quick map of the diagnosis, without a
suite run per mutant (the selftest is the full proof).

    python benchmarks/diagnosis_scan.py --dtype bfloat16 [--json scan.json]

Prints one row per (mutant, draft): PASS (the mutant leaves that draft's capture as trained),
the named kind, or CRASH (the engine failed on the draft: the suite reports that through its
crash diagnosis); then the count of cells named wrongly. Exit status 1 if any is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from harness.assertions import ConformanceFailure, assert_capture_matches_oracle
from harness.diagnosis.record import CAPTURE_KINDS, VALUE_KINDS
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import MUTANTS
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.paths import default_bundle_path
from harness.tolerances import DTYPES

CONTROL = "reference"


def judge(oracle: Oracle, cls: type[ReferenceEngine], draft: str, dtype: str) -> str:
    """PASS, the diagnosis kind of the failure, or CRASH: <first line>."""
    bundle = oracle.bundle
    engine = cls(bundle.target_dir, bundle.draft_dir(draft),
                 EngineOptions(dtype=dtype, training_convention=bundle.draft(draft).convention))
    prompts, spec = oracle.pinned_prompts, oracle.spec(draft)
    try:
        features = engine.capture(prompts).features
    except RuntimeError as crash:
        return f"CRASH: {str(crash).splitlines()[0][:80]}"
    try:
        assert_capture_matches_oracle(
            features=features, oracle=oracle, prompts=prompts, dtype=dtype, device="cpu",
            training_boundaries=spec.boundaries, engine_name=cls.name,
            engine_convention=engine.convention, config_ids=spec.layer_ids, draft=draft,
            check="diagnosis_scan", in_batch=True,
            alone=lambda some: [engine.capture([p]).features[0] for p in some])
    except ConformanceFailure as failure:
        return failure.diagnoses[0].kind if failure.diagnoses else "no diagnosis"
    return "PASS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    oracle = Oracle(load_bundle(args.bundle, verify_hashes=False))
    keys = sorted(k for k, c in MUTANTS.items()
                  if getattr(c, "expected_diagnosis_kind", None) in CAPTURE_KINDS + VALUE_KINDS)
    rows, wrong = [], 0
    for key in [CONTROL, *keys]:
        cls = ReferenceEngine if key == CONTROL else MUTANTS[key]
        expected = "PASS" if key == CONTROL else cls.expected_diagnosis_kind
        for draft in oracle.bundle.draft_names:
            got = judge(oracle, cls, draft, args.dtype)
            # a mutant may leave a draft as trained (PASS) or crash it (the crash diagnosis'
            # business); the control must pass
            bad = (got != "PASS" if key == CONTROL
                   else got not in (expected, "PASS") and not got.startswith("CRASH"))
            wrong += bad
            rows.append({"mutant": key, "draft": draft, "named": got, "expected": expected,
                         "wrong": bad})
            print(f"{key:30} {draft:18} {got:24} {'<-- expected ' + expected if bad else ''}",
                  flush=True)
    failing = sum(r["named"] not in ("PASS",) and not r["named"].startswith("CRASH")
                  for r in rows if r["mutant"] != CONTROL)
    print(f"{args.dtype}: {wrong} of {failing} failing (mutant, draft) cells named wrongly"
          f"{'' if rows[0]['named'] == 'PASS' else '; the control failed'}")
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "rows": rows, "wrong": wrong}, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
