"""False alarms of the suite's judgement on the control: the reference engine (correct by
construction) in a chosen dtype and device, judged by the suite's own assertion helpers on
random prompts drawn as the drawn-prompt strategy draws them (half corpus-like: a pinned
prompt's prefix, sometimes with a token outside the draft vocabulary; half uniform ids;
1-32 tokens). Every failure counted here is a false alarm.

    python benchmarks/false_alarms.py --dtype bfloat16 --device cpu --prompts 500
    python benchmarks/false_alarms.py --dtype bfloat16 --device cuda --prompts 500 --json fa.json
    python benchmarks/false_alarms.py --leave-one-out --dtype bfloat16 --prompts 1000 --no-trace \
        --lossless-prompts 0 --jobs 8 --json loo.json

--leave-one-out is the non-circular control (issue #30): each member of the precision
envelope (harness/models/variants.py) is run as the engine and judged against the envelope of
the OTHER members, so no engine is judged by a bound it set itself. On a GPU machine the CUDA
members are engines too; with --envelope cpu a CUDA engine is judged against CPU members only.

Checks: capture (assert_capture_matches), fc (assert_fc_matches), batch invariance of the
features (batch_leaks, the prompt inside a random ragged batch of the other drawn prompts),
losslessness near-ties (divergence, speculative vs plain greedy; generation is the slow part,
so --lossless-prompts of the prompts), and the acceptance trace (the check's own pinned run
against the golden trace, once per draft).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from harness.core.tolerances import DTYPES, tolerance_for
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import load_bundle
from harness.golden.envelope import Envelope, envelope_members
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.acceptance import (
    acceptance_from_traces,
    golden_traces,
    same_dtype_acceptance,
)
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches,
    assert_fc_matches,
    batch_leaks,
    divergence,
)
from harness.judgement.precision import is_reduced, reference_fc, trace_allowance
from harness.models.variants import implementation as variant
from harness.run.strategies import SPECIAL_TOKENS

CHECKS = ("capture", "fc", "batch_invariance", "lossless", "acceptance_trace")


def draw_prompts(oracle: Oracle, draft: str, count: int, seed: int) -> list[list[int]]:
    """The drawn-prompt strategy's mix (harness.run.strategies.prompts), seeded."""
    rng = random.Random(seed)
    model = oracle.draft(draft)
    vocab = model.cfg.vocab_size
    outside = (~model.t2d).nonzero().flatten()[3:].tolist()
    pinned = oracle.pinned_prompts
    out = []
    for _ in range(count):
        if rng.random() < 0.5:
            base = list(rng.choice(pinned))
            body = base[:rng.randint(1, len(base))]
            if outside and rng.random() < 0.5:
                body[rng.randrange(len(body))] = rng.choice(outside)
        else:
            body = [rng.randint(SPECIAL_TOKENS, vocab - 1) for _ in range(rng.randint(1, 32))]
        out.append(body)
    return out


class Tally:
    """False alarms per check, with the first few messages and prompts."""

    def __init__(self) -> None:
        self.judged = dict.fromkeys(CHECKS, 0)
        self.alarms = dict.fromkeys(CHECKS, 0)
        self.examples: dict[str, list[dict]] = {c: [] for c in CHECKS}
        self.ambiguous_tokens = 0
        self.tie_tokens = 0
        self.outlier_tokens = 0
        # prompts judged ok whose worst token is beyond the dtype's fixed rtol: the hard cases
        # tests/test_precision.py pins (a fixed per-token bound would cry wolf on them)
        self.hard_cases: list[dict] = []

    def judge(self, check: str, prompts: list[list[int]], fn: Callable[[], object]) -> object:
        self.judged[check] += 1
        try:
            return fn()
        except ConformanceFailure as err:
            self.alarms[check] += 1
            if len(self.examples[check]) < 5:
                self.examples[check].append({"prompts": prompts, "message": str(err).splitlines()[0][:400]})
            return None


def run_draft(oracle: Oracle, draft: str, args: argparse.Namespace,
              implementation: str | None = None, part: tuple[int, int] = (0, 1)) -> Tally:
    """Judge the reference engine run as `implementation` (None: transformers' defaults, on
    --device) against the envelope of the OTHER members: leave-one-out, so that the engine is
    never part of the envelope it is judged by. `part` (i, n): the i-th of n slices of the
    drawn prompts (the same draw whatever n), so cells can run in parallel."""
    spec = oracle.spec(draft)
    dtype = args.dtype
    impl = variant(implementation or "transformers")
    device = impl.device if implementation else args.device
    engine = ReferenceEngine(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft),
                             EngineOptions(dtype=dtype, device=device, training_convention=spec.convention),
                             implementation=impl.name.partition("@")[0] if implementation else None)
    left_out = impl.name if implementation else None
    tally = Tally()
    everything = draw_prompts(oracle, draft, args.prompts, args.seed)
    prompts = everything[part[0]::part[1]]
    rng = random.Random(args.seed + 1 + part[0])

    def noise(p: list[int]) -> Envelope | None:
        if not is_reduced(dtype):
            return None
        env = oracle.envelope(p, dtype)
        return env.without(left_out) if left_out in env.members else env

    ctx = CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype=dtype,
                         engine_name=engine.name, draft=draft, check="test_capture_drawn_prompts")
    try:
        for i, p in enumerate(prompts):
            cap = engine.capture([p])
            diag = tally.judge("capture", [p], lambda cap=cap, p=p: assert_capture_matches(
                ctx, features=cap.features, golden=[oracle.features(p)], prompts=[p],
                envelopes=[noise(p)] if is_reduced(dtype) else None))
            if diag is not None and "precision" in diag.details:
                tally.ambiguous_tokens += diag.details["precision"]["ambiguous"]
                tally.tie_tokens += diag.details["precision"]["routing_tie"]
                tally.outlier_tokens += diag.details["precision"]["precision_outlier"]
                worst = float(diag.details["precision"].get("worst_rel_error", 0.0))
                if diag.kind == "ok" and worst > tolerance_for(dtype).rtol:
                    tally.hard_cases.append({"prompt": p, "worst_rel_error": round(worst, 4)})
            f = cap.features[0]
            tally.judge("fc", [p], lambda cap=cap, p=p, f=f: assert_fc_matches(
                fc_out=cap.fc_out, features=cap.features, expected=[oracle.fc(draft, f)], dtype=dtype,
                draft_hidden=engine.draft.cfg.hidden_size, norm_before_fc=engine.draft.cfg.norm_before_fc,
                fc_norm=engine.draft.cfg.fc_norm, engine_name=engine.name, draft=draft, prompts=[p],
                same_dtype=reference_fc(oracle, draft, [f], dtype, without=left_out)))
            companions = rng.sample(everything, rng.randint(0, 7))
            pos = rng.randint(0, len(companions))
            batch = companions[:pos] + [p] + companions[pos:]
            inside = engine.capture(batch).features[pos]

            def leaks(inside=inside, p=p, f=f) -> None:
                bad, total, worst, bound = batch_leaks(
                    inside, f, dtype=dtype, golden=oracle.features(p), envelope=noise(p))
                if bad or inside.shape != f.shape:
                    raise ConformanceFailure(f"batch invariance: {bad}/{total} tokens off, worst "
                                             f"{worst:.3g} (tolerance {bound})", [])

            tally.judge("batch_invariance", batch, leaks)
            if i < args.lossless_prompts:
                spec_tokens = engine.generate([p], 16, True).tokens[0]
                plain = engine.generate([p], 16, False).tokens[0]

                def lossless(p=p, s=spec_tokens, g=plain) -> None:
                    _, failure = divergence(oracle, p, s, g, dtype, device)
                    if failure:
                        raise ConformanceFailure(failure, [])

                tally.judge("lossless", [p], lossless)
        if args.no_trace or part[0] != 0:
            return tally
        pinned = oracle.pinned_prompts
        n = int(oracle.bundle.manifest["prompts"]["continuation_len"])

        def trace() -> None:
            gen = engine.generate(pinned, n, True)
            want = acceptance_from_traces(golden_traces(oracle, draft), spec.num_draft_tokens)
            got = gen.acceptance.mean_acceptance_length
            gap = abs(got - want.mean_acceptance_length)
            allowed, _ = trace_allowance(want.mean_acceptance_length, gap, dtype, lambda: same_dtype_acceptance(
                oracle, draft, engine.options, pinned, n))
            if gap > allowed:
                raise ConformanceFailure(f"acceptance {got:.3f} vs golden {want.mean_acceptance_length:.3f}", [])

        tally.judge("acceptance_trace", pinned, trace)
    finally:
        engine.close()
    return tally


def _record_cell(figures: dict, implementation: str | None, draft: str, cell: dict,
                 args: argparse.Namespace) -> None:
    """Add one slice's figures to its (engine, draft) cell, print the cell, save the JSON."""
    name = implementation or "reference"
    found = next((c for c in figures["cells"] if (c["engine"], c["draft"]) == (name, draft)), None)
    if found is None:
        found = {"engine": name, "draft": draft, **cell}
        figures["cells"].append(found)
    else:
        for key in ("false_alarms", "judged"):
            found[key] = {c: found[key][c] + cell[key][c] for c in CHECKS}
        for key in ("ambiguous_slot_tokens", "routing_tie_slot_tokens",
                    "precision_outlier_slot_tokens", "seconds"):
            found[key] = round(found[key] + cell[key], 1)
        found["examples"] = {c: (found["examples"][c] + cell["examples"][c])[:5] for c in CHECKS}
        found["hard_cases"] = sorted(found["hard_cases"] + cell["hard_cases"],
                                     key=lambda c: -c["worst_rel_error"])[:10]
    print(f"{name:<24}{draft:<20}" + "".join(f"{_ratio(found, c):>18}" for c in CHECKS)
          + f"{found['ambiguous_slot_tokens']:>11}{found['routing_tie_slot_tokens']:>7}"
          + f"{found['precision_outlier_slot_tokens']:>10}", flush=True)
    if args.json:  # after every slice, so an interrupted run keeps what it measured
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def _ratio(cell: dict, check: str) -> str:
    return f"{cell['false_alarms'][check]}/{cell['judged'][check]}"


def _job(bundle: Path, members: str, draft: str, engines: list[str | None], part: tuple[int, int],
         args: argparse.Namespace) -> list[tuple[str | None, str, dict]]:
    """One draft's slice of prompts judged for every engine, in its own process when --jobs > 1
    (one process per slice: the envelopes of its prompts are computed once for all engines)."""
    torch.set_num_threads(args.threads)
    oracle = Oracle(load_bundle(bundle, verify_hashes=False),
                    members=envelope_members(cuda=False) if members == "cpu" else None)
    out = []
    for implementation in engines:
        t0 = time.perf_counter()
        tally = run_draft(oracle, draft, args, implementation, part)
        out.append((implementation, draft, {
            "false_alarms": tally.alarms, "judged": tally.judged,
            "ambiguous_slot_tokens": tally.ambiguous_tokens,
            "routing_tie_slot_tokens": tally.tie_tokens,
            "precision_outlier_slot_tokens": tally.outlier_tokens,
            "examples": tally.examples,
            "hard_cases": sorted(tally.hard_cases, key=lambda c: -c["worst_rel_error"])[:10],
            "envelope": [i.name for i in oracle.envelopes.members if i.name != implementation],
            "seconds": round(time.perf_counter() - t0, 1)}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=500, help="random prompts per draft")
    ap.add_argument("--lossless-prompts", type=int, default=100,
                    help="of them, how many are also generated for the losslessness check")
    ap.add_argument("--no-trace", action="store_true", help="skip the acceptance-trace check")
    ap.add_argument("--draft", action="append", help="only this draft (repeatable)")
    ap.add_argument("--leave-one-out", action="store_true",
                    help="judge each envelope member, run as the engine, against the envelope of "
                         "the others (the non-circular control)")
    ap.add_argument("--member", action="append",
                    help="with --leave-one-out: only this member as the engine (repeatable; "
                         "NAME@cuda for a GPU member)")
    ap.add_argument("--envelope", choices=("all", "cpu"), default="all",
                    help="cpu: envelopes of CPU members only (a CUDA engine judged against an "
                         "envelope that holds no CUDA computation)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="cells run in parallel processes")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: torch {torch.__version__} sees no CUDA device; run on a GPU "
              f"machine or pass --device cpu", file=sys.stderr)
        return 2
    bundle = load_bundle(args.bundle, verify_hashes=False)
    drafts = args.draft or list(bundle.manifest["drafts"])
    members = envelope_members(cuda=False if args.envelope == "cpu" else None)
    if args.leave_one_out:
        engines: list[str | None] = args.member or [m.name for m in members]
    else:
        engines = [None]
    figures: dict = {"dtype": args.dtype, "device": args.device, "prompts": args.prompts,
                     "lossless_prompts": min(args.lossless_prompts, args.prompts), "seed": args.seed,
                     "torch": torch.__version__, "leave_one_out": args.leave_one_out,
                     "envelope": args.envelope,
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                     "cells": []}
    start = time.perf_counter()
    print(f"{'engine':<24}{'draft':<20}" + "".join(f"{c:>18}" for c in CHECKS)
          + f"{'ambiguous':>11}{'ties':>7}{'outliers':>10}", flush=True)
    # small slices: a run stopped at a time limit keeps every slice it finished
    parts = max(1, (3 * args.jobs) // len(drafts)) if args.jobs > 1 else 1
    jobs = [(args.bundle, args.envelope, d, engines, (i, parts), args)
            for d in drafts for i in range(parts)]

    def record(results: list[tuple[str | None, str, dict]]) -> None:
        for implementation, draft, cell in results:
            _record_cell(figures, implementation, draft, cell, args)

    if args.jobs > 1:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            for fut in as_completed([pool.submit(_job, *j) for j in jobs]):
                record(fut.result())
    else:
        for j in jobs:
            record(_job(*j))
    figures["seconds"] = round(time.perf_counter() - start, 1)
    total = sum(sum(c["false_alarms"].values()) for c in figures["cells"])
    judged = sum(c["judged"]["capture"] for c in figures["cells"])
    print(f"{total} false alarms over {judged} judged prompts in {figures['seconds']} s "
          f"({args.dtype}; engines {', '.join(e or 'reference' for e in engines)})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
