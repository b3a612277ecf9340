"""The kinds seen past the capture, on the draft's side: fc skipped or computed differently, fc
applied to the draft's own recurrent state, d2t read as absolute ids, the draft KV cache not
rolled back. The checks that observe them decide when (harness.judgement.assertions,
harness.judgement.acceptance); this module recognises an fc output that is a raw aux slot and words
each kind with its fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.diagnosis.record import Diagnosis


def fc_output_is_raw_input(fc_out: torch.Tensor, features: torch.Tensor, rtol: float) -> int | None:
    """Which H-wide chunk of the features the engine's "fc output" equals, if any: the
    signature of an engine that skipped fc (it handed the raw aux state on)."""
    hidden = fc_out.shape[-1]
    if features.shape[-1] % hidden:
        return None
    for s in range(features.shape[-1] // hidden):
        chunk = features[:, s * hidden:(s + 1) * hidden].float()
        err = (fc_out.float() - chunk).norm() / chunk.norm().clamp_min(1e-12)
        if err <= rtol:
            return s
    return None


def diagnose_fc(fc_out: Sequence[torch.Tensor], features: Sequence[torch.Tensor], detail: str,
                rtol: float, *, draft_hidden: int, norm_before_fc: bool, fc_norm: bool) -> Diagnosis:
    """Name why an fc output that the checks found wrong is wrong: a raw aux slot handed on
    (fc skipped), or else fc computed with other weights, norms or slot order."""
    width = int(features[0].shape[-1])
    slot = next((s for s in (fc_output_is_raw_input(o, f, rtol)
                             for o, f in zip(fc_out, features, strict=True)) if s is not None), None)
    if slot is not None:
        return fc_diagnosis("fc_skipped", f"{detail}; it equals aux slot {slot} unprojected (fc "
                                          f"input width {width}, draft hidden {draft_hidden})",
                            raw_slot=slot)
    return fc_diagnosis("fc_wrong", f"{detail}; the trained flags are norm_before_fc="
                                    f"{norm_before_fc}, fc_norm={fc_norm}")


_FC_TEXT = {
    "fc_skipped": (
        "fc skipped — the draft's decoder got the raw aux state instead of fc(aux). Engines that "
        "decide 'apply fc?' by comparing widths skip it whenever num_aux * target_hidden equals "
        "the draft hidden size (e.g. one aux layer), or run an EAGLE-3 draft as EAGLE. Fix in the "
        "engine: apply fc to the aux states on the first draft step unconditionally."),
    "fc_wrong": (
        "fc computed differently from training — not a skipped fc (the output equals no raw aux "
        "slot) but other weights, a dropped or extra norm (norm_before_fc / fc_norm), or a "
        "different slot order inside fc. Fix the engine's fc weight loading and norm flags."),
    "fc_on_recurrent_state": (
        "fc applied to the draft's own recurrent state — training applies fc once, on the first "
        "draft step; later steps feed the draft's H-wide pre-norm output straight in. Fix in the "
        "engine: skip fc after the first draft step."),
    "d2t_absolute": (
        "d2t read as absolute target ids — SpecForge's d2t holds offsets (target id = i + d2t[i]); "
        "read as ids, every drafted token maps to the wrong target token. Fix the engine's "
        "draft-to-target mapping, or convert d2t when loading."),
    "draft_kv_not_rolled_back": (
        "draft KV not rolled back — after a verify step rejects drafted tokens, their entries stay "
        "in the draft's KV cache, so later drafts attend to tokens that were never accepted. Fix "
        "in the engine: truncate the draft cache to the accepted prefix."),
}


def fc_diagnosis(kind: str, detail: str = "", **details: Any) -> Diagnosis:
    """A Diagnosis for a bug seen past the capture: in fc, the vocab map or the draft cache."""
    if kind not in _FC_TEXT:
        raise ValueError(f"unknown fc-level kind {kind!r}; use one of {sorted(_FC_TEXT)}")
    message = (f"{detail.rstrip('.')}; root cause: " if detail else "root cause: ") + _FC_TEXT[kind]
    return Diagnosis(kind=kind, message=message, engine_boundaries=[], training_boundaries=[],
                     suggested_layer_ids=None, details=details)
