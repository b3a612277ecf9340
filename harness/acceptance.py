"""Acceptance arithmetic and the explanation of an acceptance shortfall.

Acceptance is where wiring bugs finally show, but it is a symptom: explaining it means
going back through capture, vocabulary map, fc and the draft cache, cheapest evidence first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.assertions import judge_fc
from harness.diagnosis.capture import diagnose_capture
from harness.diagnosis.draft_side import fc_diagnosis
from harness.diagnosis.record import Diagnosis
from harness.engines.base import Acceptance, Capability, Engine, Generation
from harness.golden.oracle import Oracle
from harness.tolerances import tolerance_for


def acceptance_from_traces(traces: Sequence[Sequence[int]], k: int) -> Acceptance:
    """vLLM-style counters from per-round accepted counts."""
    acc = Acceptance(accepted_per_pos=[0] * k)
    for trace in traces:
        for accepted in trace:
            acc.num_drafts += 1
            acc.num_draft_tokens += k
            acc.num_accepted_tokens += accepted
            for i in range(accepted):
                acc.accepted_per_pos[i] += 1
    return acc


def golden_traces(oracle: Oracle, draft: str) -> list[list[int]]:
    t = oracle.bundle.tensors[f"{draft}.accept_trace"]
    return [[int(x) for x in row if x >= 0] for row in t]


@torch.no_grad()
def explain_shortfall(engine: Engine, oracle: Oracle, draft: str, generation: Generation,
                      golden: Sequence[Sequence[int]] | None) -> Diagnosis:
    """Name the likeliest cause of acceptance below training, from the cheapest evidence."""
    spec = oracle.spec(draft)
    tol = tolerance_for(engine.options.dtype)
    rtol = tol.rtol
    prompts = oracle.pinned_prompts
    capture = engine.capture(prompts) if Capability.CAPTURE in engine.capabilities else None
    if capture is not None:
        diag = diagnose_capture(capture.features, [oracle.features(p) for p in prompts],
                                spec.boundaries, engine_convention=engine.convention,
                                config_ids=spec.layer_ids, rtol=rtol,
                                outlier_budget=tol.outlier_budget)
        if diag.kind != "ok":
            return diag
    draft_model = oracle.draft(draft)
    if generation.proposed is not None:
        outside = [t for row in generation.proposed for t in row if not bool(draft_model.t2d[t])]
        if outside:
            return fc_diagnosis("d2t_absolute", f"{len(outside)} drafted tokens lie outside the draft "
                                               f"vocabulary (t2d), e.g. {outside[:5]}",
                                outside=outside[:20])
    if capture is not None and capture.fc_out is not None:
        verdict = judge_fc(capture.fc_out, capture.features,
                           [oracle.fc(draft, f) for f in capture.features], rtol,
                           draft_hidden=draft_model.cfg.hidden_size,
                           norm_before_fc=draft_model.cfg.norm_before_fc, fc_norm=draft_model.cfg.fc_norm)
        if not verdict.ok:
            assert verdict.diagnosis is not None
            return verdict.diagnosis
    if golden is None and generation.traces is not None and Capability.GENERATE in engine.capabilities:
        # held-out prompts have no golden trace: judge the draft loop on the pinned ones, where
        # training's per-round trace is stored (seconds, and only once a check has failed)
        generation = engine.generate(prompts, int(oracle.bundle.manifest["prompts"]["continuation_len"]),
                                     True)
        golden = golden_traces(oracle, draft)
    if generation.traces is not None and golden is not None:
        first_same = all(e[:1] == g[:1] for e, g in zip(generation.traces, golden, strict=True))
        if first_same:
            return fc_diagnosis("draft_kv_not_rolled_back",
                                "every prompt's first verify round matches training, later rounds "
                                "fall short: the draft state left over from a rejection is wrong")
        pos0 = sum(1 for e in generation.traces for a in e if a >= 1)
        gold0 = sum(1 for g in golden for a in g if a >= 1)
        if pos0 >= 0.8 * gold0:
            return fc_diagnosis("fc_on_recurrent_state",
                                "first drafted tokens are accepted as often as in training but deeper "
                                "positions collapse: draft steps after the first get the wrong hidden "
                                "state", position0_accepts=pos0, golden_position0_accepts=gold0)
    return Diagnosis(kind="unrecognised", message="acceptance falls short although capture, fc and the "
                     "vocabulary map match training; inspect the engine's draft loop (positions, "
                     "KV cache, sampling)", engine_boundaries=[], training_boundaries=list(spec.boundaries),
                     suggested_layer_ids=None)


def heldout_prompts(oracle: Oracle) -> list[list[int]]:
    ids: torch.Tensor = oracle.bundle.tensors["heldout.ids"]
    return ids.tolist()
