"""False alarms of the suite's judgement on the control: the reference engine (correct by
construction) in a chosen dtype and device, judged by the suite's own assertion helpers on
random prompts drawn as the drawn-prompt strategy draws them (half corpus-like: a pinned
prompt's prefix, sometimes with a token outside the draft vocabulary; half uniform ids;
1-32 tokens). Every failure counted here is a false alarm.

    python benchmarks/false_alarms.py --dtype bfloat16 --device cpu --prompts 500
    python benchmarks/false_alarms.py --dtype bfloat16 --device cuda --prompts 500 --json fa.json

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
from pathlib import Path

import torch

from harness.acceptance import acceptance_from_traces, golden_traces, same_dtype_acceptance
from harness.assertions import (
    ConformanceFailure,
    assert_capture_matches,
    assert_fc_matches,
    batch_leaks,
    divergence,
)
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import load_bundle
from harness.golden.oracle import Oracle
from harness.paths import default_bundle_path
from harness.strategies import SPECIAL_TOKENS
from harness.tolerances import DTYPES, tolerance_for

CHECKS = ("capture", "fc", "batch_invariance", "lossless", "acceptance_trace")


def draw_prompts(oracle: Oracle, draft: str, count: int, seed: int) -> list[list[int]]:
    """The drawn-prompt strategy's mix (harness.strategies.prompts), seeded."""
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


def run_draft(oracle: Oracle, draft: str, args: argparse.Namespace) -> Tally:
    spec = oracle.spec(draft)
    dtype, device = args.dtype, args.device
    strict = tolerance_for(dtype).strict
    engine = ReferenceEngine(oracle.bundle.target_dir, oracle.bundle.draft_dir(draft),
                             EngineOptions(dtype=dtype, device=device, training_convention=spec.convention))
    tally = Tally()
    prompts = draw_prompts(oracle, draft, args.prompts, args.seed)
    rng = random.Random(args.seed + 1)
    noise = (lambda p: None) if strict else (lambda p: oracle.reference_features(p, dtype, device))
    try:
        for i, p in enumerate(prompts):
            cap = engine.capture([p])
            diag = tally.judge("capture", [p], lambda cap=cap, p=p: assert_capture_matches(
                features=cap.features, golden=[oracle.features(p)], training_boundaries=spec.boundaries,
                dtype=dtype, engine_name=engine.name, engine_convention=None, config_ids=spec.layer_ids,
                draft=draft, prompts=[p], check="test_capture_drawn_prompts",
                noise=None if strict else [noise(p)]))
            if diag is not None and "precision" in diag.details:
                tally.ambiguous_tokens += diag.details["precision"]["ambiguous"]
                tally.outlier_tokens += diag.details["precision"]["precision_outlier"]
                worst = float(diag.details["precision"].get("worst_rel_error", 0.0))
                if diag.kind == "ok" and worst > tolerance_for(dtype).rtol:
                    tally.hard_cases.append({"prompt": p, "worst_rel_error": round(worst, 4)})
            f = cap.features[0]
            tally.judge("fc", [p], lambda cap=cap, p=p, f=f: assert_fc_matches(
                fc_out=cap.fc_out, features=cap.features, expected=[oracle.fc(draft, f)], dtype=dtype,
                draft_hidden=engine.draft.cfg.hidden_size, norm_before_fc=engine.draft.cfg.norm_before_fc,
                fc_norm=engine.draft.cfg.fc_norm, engine_name=engine.name, draft=draft, prompts=[p],
                same_dtype=None if strict else [oracle.reference_fc(draft, f, dtype, device)]))
            companions = rng.sample(prompts, rng.randint(0, 7))
            pos = rng.randint(0, len(companions))
            batch = companions[:pos] + [p] + companions[pos:]
            inside = engine.capture(batch).features[pos]

            def leaks(inside=inside, p=p, f=f) -> None:
                bad, total, worst, bound = batch_leaks(
                    inside, f, dtype=dtype, golden=oracle.features(p),
                    noise=noise(p))
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
        pinned = oracle.pinned_prompts
        n = int(oracle.bundle.manifest["prompts"]["continuation_len"])

        def trace() -> None:
            gen = engine.generate(pinned, n, True)
            want = acceptance_from_traces(golden_traces(oracle, draft), spec.num_draft_tokens)
            got = gen.acceptance.mean_acceptance_length
            tol = tolerance_for(dtype)
            allowed = tol.trace * want.mean_acceptance_length
            gap = abs(got - want.mean_acceptance_length)
            if gap > allowed and not tol.strict:
                own = same_dtype_acceptance(oracle, draft, engine.options, pinned, n)
                allowed += tol.noise_factor * abs(own - want.mean_acceptance_length)
            if gap > allowed:
                raise ConformanceFailure(f"acceptance {got:.3f} vs golden {want.mean_acceptance_length:.3f}", [])

        tally.judge("acceptance_trace", pinned, trace)
    finally:
        engine.close()
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=default_bundle_path())
    ap.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=500, help="random prompts per draft")
    ap.add_argument("--lossless-prompts", type=int, default=100,
                    help="of them, how many are also generated for the losslessness check")
    ap.add_argument("--draft", action="append", help="only this draft (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: torch {torch.__version__} sees no CUDA device; run on a GPU "
              f"machine or pass --device cpu", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    oracle = Oracle(load_bundle(args.bundle, verify_hashes=False))
    drafts = args.draft or list(oracle.bundle.manifest["drafts"])
    figures: dict = {"dtype": args.dtype, "device": args.device, "prompts": args.prompts,
                     "lossless_prompts": min(args.lossless_prompts, args.prompts), "seed": args.seed,
                     "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
                     "drafts": {}}
    start = time.perf_counter()
    print(f"{'draft':<20}" + "".join(f"{c:>18}" for c in CHECKS) + f"{'ambiguous':>11}{'outliers':>10}")
    for draft in drafts:
        t0 = time.perf_counter()
        tally = run_draft(oracle, draft, args)
        print(f"{draft:<20}" + "".join(f"{f'{tally.alarms[c]}/{tally.judged[c]}':>18}" for c in CHECKS)
              + f"{tally.ambiguous_tokens:>11}{tally.outlier_tokens:>10}", flush=True)
        figures["drafts"][draft] = {"false_alarms": tally.alarms, "judged": tally.judged,
                                    "ambiguous_slot_tokens": tally.ambiguous_tokens,
                                    "precision_outlier_slot_tokens": tally.outlier_tokens,
                                    "examples": tally.examples,
                                    "hard_cases": sorted(tally.hard_cases, key=lambda c: -c["worst_rel_error"])[:10],
                                    "seconds": round(time.perf_counter() - t0, 1)}
        if args.json:  # after every draft, so an interrupted run keeps what it measured
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    figures["seconds"] = round(time.perf_counter() - start, 1)
    total = sum(sum(d["false_alarms"].values()) for d in figures["drafts"].values())
    print(f"{total} false alarms in {figures['seconds']} s ({args.dtype} on {args.device})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
