"""Every capture mutant of the bug zoo on every bundle draft, judged on the pinned batch the way
the capture check judges it (one batch, each prompt alone as the batch evidence), in a chosen
dtype: the kind named against the kind expected. A quick map of the diagnosis, without a
suite run per mutant (the selftest is the full proof).

    python benchmarks/diagnosis_scan.py --dtype bfloat16 [--configs] [--mutant KEY] [--json scan.json]

--configs adds the layer-id check's drafts (harness.mutant_scan.factory_drafts), each served
to every mutant. A cell named as another mutant whose capture of that draft is bit-identical
is not counted wrong: no evidence can tell the two apart there.

Prints one row per (mutant, draft): PASS (the mutant leaves that draft's capture as trained),
the named kind, or CRASH (the engine failed on the draft: the suite reports that through its
crash diagnosis); then the count of cells named wrongly. Exit status 1 if any is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from harness.diagnosis.record import CAPTURE_KINDS, VALUE_KINDS
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import MUTANTS
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.mutant_scan import bundle_drafts, factory_drafts, judge, same_capture
from harness.paths import default_bundle_path
from harness.tolerances import DTYPES

CONTROL = "reference"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--configs", action="store_true",
                    help="also the layer-id check's factory drafts (see the module docstring)")
    ap.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    oracle = Oracle(load_bundle(args.bundle, verify_hashes=False))
    keys = sorted(k for k, c in MUTANTS.items()
                  if getattr(c, "expected_diagnosis_kind", None) in CAPTURE_KINDS + VALUE_KINDS
                  and (not args.mutant or k in args.mutant))
    scratch = Path(tempfile.mkdtemp(prefix="diagnosis-scan-"))
    drafts = bundle_drafts(oracle) + (factory_drafts(oracle, scratch) if args.configs else [])
    rows, wrong = [], 0
    for key in [CONTROL, *keys]:
        cls = ReferenceEngine if key == CONTROL else MUTANTS[key]
        expected = "PASS" if key == CONTROL else cls.expected_diagnosis_kind
        for served in drafts:
            draft = served.name
            got = judge(oracle, cls, served, args.dtype)
            # a mutant may leave a draft as trained (PASS) or crash it (the crash diagnosis'
            # business); the control must pass
            bad = (got != "PASS" if key == CONTROL
                   else got not in (expected, "PASS") and not got.startswith("CRASH"))
            # named as another mutant whose capture of this draft is bit-identical: the
            # evidence cannot tell them apart, so the name is not wrong
            twin = next((k for k in MUTANTS if bad and key != CONTROL and
                         MUTANTS[k].expected_diagnosis_kind == got and
                         same_capture(oracle, cls, MUTANTS[k], served, args.dtype)), None)
            bad = bad and twin is None
            wrong += bad
            rows.append({"mutant": key, "draft": draft, "named": got, "expected": expected,
                         "wrong": bad, "indistinguishable_from": twin})
            note = (f"<-- expected {expected}" if bad else
                    f"(captures exactly as zoo:{twin}, which expects {got})" if twin else "")
            print(f"{key:30} {draft:22} {got:24} {note}", flush=True)
    failing = sum(r["named"] not in ("PASS",) and not r["named"].startswith("CRASH")
                  for r in rows if r["mutant"] != CONTROL)
    print(f"{args.dtype}: {wrong} of {failing} failing (mutant, draft) cells named wrongly"
          f"{'' if rows[0]['named'] == 'PASS' else '; the control failed'}")
    shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "rows": rows, "wrong": wrong}, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
