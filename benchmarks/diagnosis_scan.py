"""Every capture mutant of the bug zoo on every bundle draft, judged on the pinned batch the way
the capture check judges it (one batch, each prompt alone as the batch evidence), in a chosen
dtype: the kind named against the kind expected. A quick map of the diagnosis, without a
suite run per mutant (the selftest is the full proof).

    python benchmarks/diagnosis_scan.py --dtype bfloat16 [--configs] [--mutant KEY] [--json scan.json]

--configs adds the layer-id check's drafts (harness.tools.mutant_scan.factory_drafts), each served
to every mutant. A cell named as another mutant whose capture of that draft is bit-identical
is not counted wrong: no evidence can tell the two apart there.

Prints one row per (mutant, draft): PASS (the mutant leaves that draft's capture as trained),
the named kind, or CRASH (the engine failed on the draft: the suite reports that through its
crash diagnosis); then the count of cells named wrongly. Exit status 1 if any is.

Each row also prints the diagnosis' confidence (issue #31): its margin over the runner-up
among the competing explanations, the runner-up, and "AMBIGUOUS" where the report says
"ambiguous between"; a wrong kind printed without it is counted "confidently wrong".
--heldout adds the mutants of harness.engines.heldout (outside every zoo class; each lists the
kinds that are right for it); their batch- and acceptance-level bugs are judged the way
suites/test_batch_invariance.py (diagnose_batch_leak on the pinned batch) and
suites/test_acceptance.py (explain_shortfall, specforge-default only: ~15 s a cell) judge them,
with the zoo's fc_on_recurrent_state and d2t_absolute as the acceptance controls. Decode-feed
and position bugs are judged as suites/test_decode_inputs.py judges them
(assert_decode_inputs_match on the pinned prompts, every bundle draft), request-history bugs as
suites/test_request_history.py does (the longest pinned prompts served, unrelated held-out
prompts, the probes again in reverse order: assert_history_independent, every bundle draft),
with the zoo's decode_rows_one_late, draft_kv_not_rolled_back, draft_positions_shifted and
state_leaks_between_requests as controls (and fc_on_recurrent_state, whose feeds are right:
the decode-input check must pass it); fc bugs as suites/test_fc_projection.py does
(assert_fc_matches on the engine's own features), with norm_before_fc_flipped as the control.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.core.tolerances import DTYPES
from harness.diagnosis.record import CAPTURE_KINDS, VALUE_KINDS, Diagnosis
from harness.engines.base import EngineOptions
from harness.engines.heldout import HELDOUT
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import MUTANTS
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.acceptance import explain_shortfall, golden_traces, heldout_prompts
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_decode_inputs_match,
    assert_fc_matches,
    assert_history_independent,
    batch_leaks,
    diagnose_batch_leak,
)
from harness.judgement.precision import leak_evidence, reference_fc
from harness.tools.mutant_scan import (
    Served,
    bundle_drafts,
    confidence,
    diagnosed,
    factory_drafts,
    same_capture,
)

CONTROL = "reference"


def _batch_cell(oracle: Oracle, cls: type[ReferenceEngine], served: Served, dtype: str) -> tuple[str, Diagnosis | None]:
    """A batch-level bug judged as the batch-invariance check judges it on the pinned batch."""
    engine = _engine(oracle, cls, served, dtype)
    try:
        batch = oracle.pinned_prompts
        together = engine.capture(batch).features
        solo = [engine.capture([p]).features[0] for p in batch]
    finally:
        engine.close()
    golden = [oracle.features(p) for p in batch]
    leaks = [batch_leaks(x, y, dtype=dtype, golden=g, envelope=leak_evidence(oracle, p, dtype)[1])[0]
             for x, y, g, p in zip(together, solo, golden, batch, strict=True)]
    if not any(leaks):
        return "PASS", None
    diag = diagnose_batch_leak(together, solo, golden, list(served.boundaries), dtype=dtype,
                               engine_convention=engine.convention, config_ids=list(served.layer_ids),
                               found=f"{sum(leaks)} tokens leak")
    return diag.kind, diag


def _acceptance_cell(oracle: Oracle, cls: type[ReferenceEngine], served: Served,
                     dtype: str) -> tuple[str, Diagnosis | None]:
    """An acceptance-level bug explained as the acceptance check explains a shortfall."""
    spec = oracle.spec(served.name)
    engine = cls(oracle.bundle.target_dir, served.folder,
                 EngineOptions(dtype=dtype, num_draft_tokens=spec.num_draft_tokens,
                               training_convention=served.convention))
    try:
        new_tokens = int(oracle.bundle.manifest["prompts"]["continuation_len"])
        gen = engine.generate(oracle.pinned_prompts, new_tokens, True)
        diag = explain_shortfall(engine, oracle, served.name, gen, golden_traces(oracle, served.name))
    finally:
        engine.close()
    return diag.kind, diag


def _spec_engine(oracle: Oracle, cls: type[ReferenceEngine], served: Served, dtype: str) -> ReferenceEngine:
    """An engine drafting as the draft's spec says (k tokens), as the suite's fixtures build it."""
    spec = oracle.spec(served.name)
    return cls(oracle.bundle.target_dir, served.folder,
               EngineOptions(dtype=dtype, num_draft_tokens=spec.num_draft_tokens,
                             training_convention=served.convention))


def _failed(check: Callable[[], None]) -> tuple[str, Diagnosis | None]:
    """PASS, or the kind of the check's (first) diagnosis."""
    try:
        check()
    except ConformanceFailure as failure:
        diag = failure.diagnoses[0] if failure.diagnoses else None
        return (diag.kind if diag is not None else "no diagnosis"), diag
    return "PASS", None


def _decode_cell(oracle: Oracle, cls: type[ReferenceEngine], served: Served,
                 dtype: str) -> tuple[str, Diagnosis | None]:
    """A decode-feed or position bug judged as suites/test_decode_inputs.py judges it."""
    spec = oracle.spec(served.name)
    engine = _spec_engine(oracle, cls, served, dtype)
    prompts = oracle.pinned_prompts
    try:
        decode = engine.decode_inputs(prompts, int(oracle.bundle.manifest["prompts"]["continuation_len"]))
    finally:
        engine.close()
    ctx = CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype=dtype,
                         engine_name=cls.__name__, draft=served.name, check="diagnosis_scan",
                         engine_convention=engine.convention)
    return _failed(lambda: assert_decode_inputs_match(ctx, decode=decode, oracle=oracle, prompts=prompts))


def _fc_cell(oracle: Oracle, cls: type[ReferenceEngine], served: Served,
             dtype: str) -> tuple[str, Diagnosis | None]:
    """An fc bug judged as suites/test_fc_projection.py judges it: fc's output on the engine's
    own features against the trained fc on those features."""
    engine = _engine(oracle, cls, served, dtype)
    try:
        capture = engine.capture(oracle.pinned_prompts)
    finally:
        engine.close()
    draft = oracle.draft(served.name)
    return _failed(lambda: assert_fc_matches(
        fc_out=capture.fc_out, features=capture.features,
        expected=[oracle.fc(served.name, f) for f in capture.features], dtype=dtype,
        draft_hidden=draft.cfg.hidden_size, norm_before_fc=draft.cfg.norm_before_fc,
        fc_norm=draft.cfg.fc_norm, engine_name=cls.__name__, draft=served.name,
        prompts=oracle.pinned_prompts,
        same_dtype=reference_fc(oracle, served.name, capture.features, dtype)))


# suites/test_request_history.py's serving: PROBES longest pinned prompts, EARLIER unrelated
# held-out prompts between the two servings, NEW_TOKENS generated per request
PROBES, EARLIER, NEW_TOKENS = 4, 3, 16


def _history_cell(oracle: Oracle, cls: type[ReferenceEngine], served: Served,
                  dtype: str) -> tuple[str, Diagnosis | None]:
    """A request-history bug judged as suites/test_request_history.py judges it: each probe
    captured and generated as its own request, unrelated requests, the probes again reversed."""
    engine = _spec_engine(oracle, cls, served, dtype)

    def serve(prompts: list[list[int]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"features": [], "tokens": [], "traces": []}
        for prompt in prompts:
            out["features"].append(engine.capture([prompt]).features[0])
            gen = engine.generate([prompt], NEW_TOKENS, True)
            out["tokens"].append(gen.tokens[0])
            out["traces"].append(gen.traces[0] if gen.traces is not None else None)
        return out

    probes = sorted(oracle.pinned_prompts, key=len)[-PROBES:]
    try:
        first = serve(probes)
        serve(heldout_prompts(oracle)[:EARLIER])
        second = {k: v[::-1] for k, v in serve(probes[::-1]).items()}
    finally:
        engine.close()
    return _failed(lambda: assert_history_independent(
        prompts=probes, history=f"after {EARLIER} unrelated requests and in reverse order",
        features=(first["features"], second["features"]), tokens=(first["tokens"], second["tokens"]),
        traces=(first["traces"], second["traces"]), oracle=oracle, dtype=dtype, device="cpu",
        engine_name=cls.__name__, draft=served.name, check="diagnosis_scan"))


def _engine(oracle: Oracle, cls: type[ReferenceEngine], served: Served, dtype: str) -> ReferenceEngine:
    return cls(oracle.bundle.target_dir, served.folder,
               EngineOptions(dtype=dtype, training_convention=served.convention))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--configs", action="store_true",
                    help="also the layer-id check's factory drafts (see the module docstring)")
    ap.add_argument("--heldout", action="store_true",
                    help="also the mutants of harness.engines.heldout (see the module docstring)")
    ap.add_argument("--mutant", action="append", help="only this mutant (repeatable)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    oracle = Oracle(load_bundle(args.bundle, verify_hashes=False))
    keys = sorted(k for k, c in MUTANTS.items()
                  if getattr(c, "expected_diagnosis_kind", None) in CAPTURE_KINDS + VALUE_KINDS
                  and (not args.mutant or k in args.mutant))
    held = sorted(k for k in HELDOUT if args.heldout and (not args.mutant or k in args.mutant))
    scratch = Path(tempfile.mkdtemp(prefix="diagnosis-scan-"))
    bundle = bundle_drafts(oracle)
    drafts = bundle + (factory_drafts(oracle, scratch) if args.configs else [])
    rows, wrong, confident = [], 0, 0
    cells: list[tuple[str, type[ReferenceEngine], str, tuple[str, ...]]] = [
        (CONTROL, ReferenceEngine, "capture", ("PASS",))]
    cells += [(k, MUTANTS[k], "capture", (MUTANTS[k].expected_diagnosis_kind,)) for k in keys]
    cells += [(k, HELDOUT[k], where, HELDOUT[k].acceptable) for k in held
              for where in (HELDOUT[k].shows_in, *HELDOUT[k].also_shows_in)]
    if held:  # the zoo bugs the acceptance-level separating experiments must still name
        cells += [(k, MUTANTS[k], "acceptance", (k,)) for k in ("fc_on_recurrent_state", "d2t_absolute")]
        # the zoo's decode-time and history bugs, judged by the checks that see them; fc re-applied
        # to the recurrent state leaves every feed right, so the decode-input check passes it
        cells += [(k, MUTANTS[k], "decode", (MUTANTS[k].expected_diagnosis_kind,)) for k in
                  ("decode_rows_one_late", "draft_kv_not_rolled_back", "draft_positions_shifted")]
        cells += [("fc_on_recurrent_state", MUTANTS["fc_on_recurrent_state"], "decode", ("PASS",))]
        cells += [("state_leaks_between_requests", MUTANTS["state_leaks_between_requests"],
                   "history", ("history_dependent",))]
        cells += [("norm_before_fc_flipped", MUTANTS["norm_before_fc_flipped"], "fc", ("fc_wrong",))]
        cells += [(CONTROL, ReferenceEngine, kind, ("PASS",)) for kind in ("decode", "history", "fc")]
    for key, cls, shows_in, expected_kinds in cells:
        expected = "/".join(expected_kinds)
        for served in drafts:
            draft = served.name
            if shows_in == "acceptance" and draft != "specforge-default":
                continue
            if shows_in in ("decode", "history", "fc") and served not in bundle:
                continue  # served with the draft's own k: the bundle's drafts only
            if shows_in == "capture":
                got, diag, _ = diagnosed(oracle, cls, served, args.dtype)
            elif shows_in == "batch":
                got, diag = _batch_cell(oracle, cls, served, args.dtype)
            elif shows_in == "fc":
                got, diag = _fc_cell(oracle, cls, served, args.dtype)
            elif shows_in == "decode":
                got, diag = _decode_cell(oracle, cls, served, args.dtype)
            elif shows_in == "history":
                got, diag = _history_cell(oracle, cls, served, args.dtype)
            else:
                got, diag = _acceptance_cell(oracle, cls, served, args.dtype)
            margin, runner_up, ambiguous = confidence(diag)
            # a mutant may leave a draft as trained (PASS) or crash it (the crash diagnosis'
            # business); the control must pass
            bad = (got != "PASS" if key == CONTROL
                   else got not in (*expected_kinds, "PASS") and not got.startswith("CRASH"))
            # named as another mutant whose capture of this draft is bit-identical: the
            # evidence cannot tell them apart, so the name is not wrong
            twin = next((k for k in MUTANTS if bad and key != CONTROL and shows_in == "capture" and
                         MUTANTS[k].expected_diagnosis_kind == got and
                         same_capture(oracle, cls, MUTANTS[k], served, args.dtype)), None)
            bad = bad and twin is None
            wrong += bad
            confident += bad and not ambiguous
            rows.append({"mutant": key, "heldout": key in HELDOUT, "shows_in": shows_in,
                         "draft": draft, "named": got, "expected": expected, "wrong": bad,
                         "confidently_wrong": bad and not ambiguous, "margin": margin,
                         "runner_up": runner_up, "ambiguous": ambiguous,
                         "indistinguishable_from": twin})
            note = (f"<-- expected {expected}" + ("" if ambiguous else " (CONFIDENTLY WRONG)") if bad else
                    f"(captures exactly as zoo:{twin}, which expects {got})" if twin else "")
            shown = "-" if margin is None else f"{margin:.3g}"
            print(f"{key:28} {draft:18} {got:22} {shown:>8} {'AMBIGUOUS' if ambiguous else '':9} "
                  f"{(runner_up or '-')[:48]:48} {note}", flush=True)
    failing = sum(r["named"] not in ("PASS",) and not r["named"].startswith("CRASH")
                  for r in rows if r["mutant"] != CONTROL)
    print(f"{args.dtype}: {wrong} of {failing} failing (mutant, draft) cells named wrongly, "
          f"{confident} confidently wrong (a wrong kind printed without 'ambiguous'); "
          f"{sum(r['ambiguous'] for r in rows)} ambiguous"
          f"{'' if all(r['named'] == 'PASS' for r in rows if r['mutant'] == CONTROL) else '; the control failed'}")
    shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps({"dtype": args.dtype, "rows": rows, "wrong": wrong,
                                         "confidently_wrong": confident}, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
