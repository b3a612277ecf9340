"""Throughput: plain and speculative greedy decoding of one fixed workload, timed through
pytest-benchmark, and the cost-model gate that says whether speculation pays what it should.

Two gates (docs/PERFORMANCE.md):
- regression: pytest-benchmark's own `--benchmark-save` / `--benchmark-compare` /
  `--benchmark-compare-fail=min:T%` against a baseline kept per machine class;
- consistency (`test_speculation_pays_as_predicted`): the measured speedup against the one
  `harness.core.throughput` predicts from the measured acceptance length and the engine's own
  per-step costs. The motivating deployment (54.8 tok/s against 90 without speculation) fails
  it with both numbers and the dominant cost named.

Timings are the minimum over rounds (the operation's cost; the rest is interference), taken
after a warm-up round, with the device synchronised before and after each round.

Under pytest-xdist (`-n N`) pytest-benchmark disables itself, so the two benchmark checks
would time nothing: they skip with the reason instead of passing unmeasured. The cost-model
gate times itself; it runs under xdist only where each worker has a GPU of its own (plain
`--device cuda`, no more workers than GPUs: harness.run.distributed puts worker gwN on cuda:N),
and skips with the reason where workers share the devices its timings would measure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from harness.core.throughput import judge_speedup
from harness.engines.base import Capability, Engine, Generation
from harness.engines.step_costs import synchronizer
from harness.golden.oracle import Oracle
from harness.judgement.acceptance import acceptance_from_traces, explain_shortfall, golden_traces
from harness.judgement.assertions import assert_speedup_consistent, require

# timed rounds per mode after one warm-up round (EAGLE3_THROUGHPUT_ROUNDS: more for a
# baseline that must be tight, e.g. benchmarks/gate_soundness.py)
ROUNDS = int(os.environ.get("EAGLE3_THROUGHPUT_ROUNDS", "3"))
NEW_TOKENS = 24
WORKLOAD_PROMPTS = 4  # the longest pinned prompts: a fixed, bundle-defined workload


XDIST_ADVICE = ("run the throughput checks on their own, without -n: "
                "`eagle3-conformance run -k throughput`")


def _require_benchmark(benchmark: Any) -> None:
    """Skip, with the reason, where pytest-benchmark times nothing (a pass would be unmeasured)."""
    if getattr(benchmark, "disabled", False):
        why = ("pytest-xdist is active (-n), and pytest-benchmark disables itself there"
               if os.environ.get("PYTEST_XDIST_WORKER") else "--benchmark-disable was given")
        pytest.skip(f"not measured: {why}; {XDIST_ADVICE}")


def _require_own_device(config: pytest.Config) -> None:
    """Under xdist, the gate's timings are the engine's only on a device no other worker uses:
    plain `--device cuda` (one GPU per worker), no more workers than GPUs."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers <= 1:
        return
    device = torch.device(config.getoption("device"))
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type != "cuda" or device.index is not None or workers > gpus:
        pytest.skip(f"not measured: {workers} pytest-xdist workers share this machine's "
                    f"{'CPU cores' if device.type != 'cuda' else f'{gpus} GPU(s)'}, so a timing "
                    f"here judges the load, not the engine; {XDIST_ADVICE}")


def workload(oracle: Oracle) -> list[list[int]]:
    return sorted(oracle.pinned_prompts, key=len)[-WORKLOAD_PROMPTS:]


def _device_sync(engine: Engine):
    return synchronizer(torch.device(engine.options.device))


def _memo(engine: Engine) -> dict[str, Any]:
    """Per engine instance: the benchmark minimum of each mode, for the speedup figure."""
    return engine.__dict__.setdefault("_suite_throughput", {})


def _run(engine: Engine, prompts: Sequence[Sequence[int]], speculative: bool) -> Generation:
    sync = _device_sync(engine)
    sync()
    gen = engine.generate(prompts, NEW_TOKENS, speculative)
    sync()
    return gen


def _timed(engine: Engine, prompts: list[list[int]], speculative: bool, benchmark: Any) -> None:
    """One mode through pytest-benchmark (pedantic: explicit warm-up and rounds); the minimum
    round and the last generation kept for the gate, tokens/s into extra_info."""
    out: dict[str, Generation] = {}

    def once() -> None:
        out["gen"] = _run(engine, prompts, speculative)

    benchmark.pedantic(once, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    gen = out["gen"]
    tokens = sum(len(t) for t in gen.tokens)
    stats = getattr(benchmark, "stats", None)
    best = float(stats.stats.min) if stats is not None else None
    if not best:
        pytest.skip(f"not measured: pytest-benchmark recorded no timing; {XDIST_ADVICE}")
    mode = "speculative" if speculative else "plain"
    _memo(engine)[mode] = {"seconds": best, "tokens": tokens}
    benchmark.extra_info.update({"engine": engine.name, "engine_version": engine.version(),
                                 "dtype": engine.options.dtype, "device": engine.options.device,
                                 "mode": mode, "tokens": tokens,
                                 "num_draft_tokens": engine.options.num_draft_tokens})
    if best:
        benchmark.extra_info["tokens_per_s"] = round(tokens / best, 2)
    if speculative and gen.acceptance is not None:
        benchmark.extra_info["acceptance_length"] = round(gen.acceptance.mean_acceptance_length, 4)


@pytest.mark.benchmark(group="decode-plain")
def test_throughput_plain(engine: Engine, oracle: Oracle, draft_name: str, benchmark: Any,
                          report) -> None:
    require(engine, Capability.THROUGHPUT)
    _require_benchmark(benchmark)
    _timed(engine, workload(oracle), False, benchmark)
    row = _memo(engine)["plain"]
    if row["seconds"]:
        report.metric(draft_name, "plain_tokens_per_s", round(row["tokens"] / row["seconds"], 2))


@pytest.mark.benchmark(group="decode-speculative")
def test_throughput_speculative(engine: Engine, oracle: Oracle, draft_name: str, benchmark: Any,
                                report) -> None:
    require(engine, Capability.THROUGHPUT)
    _require_benchmark(benchmark)
    _timed(engine, workload(oracle), True, benchmark)
    memo = _memo(engine)
    row = memo["speculative"]
    acceptance = benchmark.extra_info.get("acceptance_length")
    if acceptance is not None:
        report.metric(draft_name, "throughput_acceptance_length", acceptance)
    if row["seconds"]:
        report.metric(draft_name, "speculative_tokens_per_s", round(row["tokens"] / row["seconds"], 2))
        plain = memo.get("plain")
        if plain and plain["seconds"]:
            benchmark.extra_info["speedup"] = round(plain["seconds"] / row["seconds"], 4)
            report.metric(draft_name, "speedup", benchmark.extra_info["speedup"])


def _interleaved(engine: Engine, prompts: list[list[int]]) -> tuple[float, float, Generation]:
    """(plain seconds, speculative seconds, a speculative generation): the minimum over
    rounds that alternate plain and speculative, so a burst of load from other work hits
    both modes alike instead of biasing their ratio."""
    best = {False: float("inf"), True: float("inf")}
    gen = _run(engine, prompts, True)
    _run(engine, prompts, False)
    for _ in range(ROUNDS):
        for speculative in (False, True):
            t0 = time.perf_counter()
            out = _run(engine, prompts, speculative)
            best[speculative] = min(best[speculative], time.perf_counter() - t0)
            gen = out if speculative else gen
    return best[False], best[True], gen


def _golden_acceptance(oracle: Oracle, draft_name: str, prompts: list[list[int]]) -> float:
    """Training's acceptance length on the workload (its golden simulated traces): what a
    correctly wired engine reaches on these prompts."""
    traces = golden_traces(oracle, draft_name)
    pinned = [list(p) for p in oracle.pinned_prompts]
    rows = [traces[pinned.index(list(p))] for p in prompts]
    return acceptance_from_traces(rows, oracle.spec(draft_name).num_draft_tokens).mean_acceptance_length


def test_speculation_pays_as_predicted(engine: Engine, oracle: Oracle, draft_name: str,
                                       report, pytestconfig: pytest.Config) -> None:
    require(engine, Capability.THROUGHPUT)
    _require_own_device(pytestconfig)
    prompts = workload(oracle)
    plain_s, spec_s, gen = _interleaved(engine, prompts)
    acc = gen.acceptance
    assert acc is not None and acc.num_drafts > 0, \
        f"{engine.name} reported no speculative rounds: speculation did not run"
    tau = acc.mean_acceptance_length
    costs = engine.step_costs(prompts[0], tau)
    if costs is None:
        pytest.skip(f"{engine.name} exposes no per-step costs (Engine.step_costs); the "
                    f"cost-model gate cannot judge it, the benchmarks still ran")
    tokens = sum(len(t) for t in gen.tokens)
    finding = judge_speedup(costs, tau, plain_s / spec_s, acc.num_drafts / tokens)
    report.metric(draft_name, "predicted_speedup", round(finding.predicted, 4))
    report.metric(draft_name, "measured_speedup", round(finding.measured, 4))
    report.metric(draft_name, "step_costs", costs.to_json())
    assert_speedup_consistent(finding, engine_name=engine.name, draft=draft_name,
                              prompts=prompts, check="test_speculation_pays_as_predicted",
                              trained_acceptance=_golden_acceptance(oracle, draft_name, prompts),
                              dtype=engine.options.dtype,
                              shortfall=lambda: explain_shortfall(engine, oracle, draft_name, gen, None))
