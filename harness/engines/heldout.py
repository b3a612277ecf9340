"""Mutants written for issue #31, outside every class of the bug zoo: each is a wiring bug no
diagnosis kind describes (or describes only in part), so the diagnosis must either name the
true cause, say "ambiguous between" it and another, or say `unrecognised`: never a wrong kind
with confidence. `acceptable` lists the kinds that are right for each (the true cause where
a kind has it, `unrecognised` always); benchmarks/diagnosis_scan.py --heldout counts a cell
"confidently wrong" when the kind named is not among them and the message does not say
"ambiguous".

They are not in `harness.engines.zoo.MUTANTS`: the selftest proves that the suite names each
zoo class, and these have no class to prove. Resolved by dotted path
(`harness.engines.heldout:<Class>`), like any outside adapter.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from harness.engines.zoo import Mutant
from harness.models.residual import TargetStates


class HeldOut(Mutant):
    """What a held-out mutant adds to a zoo mutant: the kinds a diagnosis may name for it, and
    the evidence that shows it (capture, batch or acceptance)."""

    acceptable: ClassVar[tuple[str, ...]]
    shows_in: ClassVar[str]  # "capture", "batch" or "acceptance"


class BoundaryOneReadsEmbedding(HeldOut):
    """Wrong only for boundary 1 (the output of layer 0), which no bundle draft uses: the engine
    hooks "the output of layer b-1" as `layers[b - 1]`, and for b = 1 a special case for the
    embedding (layer -1) fires, so it hands the embedding. Every other boundary is right: a
    draft trained on [1, N] gets [0, N], which is no shift of the ids."""

    name = "harness.engines.heldout:BoundaryOneReadsEmbedding"
    bug_class = "boundary 1 alone read as the embedding"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised",)
    shows_in = "capture"
    hook = "take_state"
    issue = "#31 (an engine wrong only for ids no bundle draft uses)"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.inputs[0 if boundary == 1 else boundary]


class MiddleSlotOneEarly(HeldOut):
    """Only the second aux slot one boundary early: an engine that builds its capture set from
    the ids with one of them adjusted by the wrong rule (the first-id special case of
    sgl-project/sglang PR #25454 applied to the second id). Not an offset: the other slots stay.
    Where the second slot is training's b = N, "b = N holds another boundary" is what
    `final_boundary_missing` says of that slot, so that kind is right there too."""

    name = "harness.engines.heldout:MiddleSlotOneEarly"
    bug_class = "one aux slot (the second) captured one boundary early"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised", "final_boundary_missing")
    shows_in = "capture"
    hook = "capture_boundaries"
    issue = "#31 (a shift of one id only)"

    def capture_boundaries(self) -> tuple[int, ...]:
        b = list(self.trained_boundaries())
        if len(b) > 1:
            b[1] = max(b[1] - 1, 0)
        return tuple(b)


class EmbeddingScaled(HeldOut):
    """The embedding slot handed over multiplied by sqrt(hidden): the engine applies a
    Gemma-style embedding normaliser inside its embedding module, before the capture, where the
    target has none. Only drafts with an embedding slot see it; no kind describes a rescale of
    one endpoint (it is not a norm: one scalar for every token)."""

    name = "harness.engines.heldout:EmbeddingScaled"
    bug_class = "embedding slot multiplied by sqrt(hidden)"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised",)
    shows_in = "capture"
    hook = "take_state"
    issue = "#31 (an embedding normaliser of another architecture)"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        return x * x.shape[-1] ** 0.5 if boundary == 0 else x


class AuxBatchSizeRounding(HeldOut):
    """A batch-size-dependent numeric path: the aux states come out 0.08% high in a batch and
    0.08% low alone (a kernel picked by the batch's row count, each choice within the fp32
    tolerance of training but twice it apart). Both captures pass the capture check; only
    batch invariance fails, and no known cause fits: the diagnosis must not say `ok`."""

    name = "harness.engines.heldout:AuxBatchSizeRounding"
    bug_class = "aux states rounded by a batch-size-dependent path (within tolerance either way)"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised", "batch_dependent")
    shows_in = "batch"
    hook = "take_state"
    issue = "#31 item 4 (a failed batch-invariance check carried kind ok)"
    scale: ClassVar[float] = 8e-4

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        return x * (1 + self.scale if x.shape[0] > 1 else 1 - self.scale)


class RecurrentStateNormed(HeldOut):
    """Draft steps after the first fed the draft's NORMED output (the state after its final
    norm) where training feeds the pre-norm output back: a decode-time bug outside the fc path.
    The first drafted token is as trained, deeper ones collapse, which is also what fc re-applied
    to the recurrent state shows; its remedy ("skip fc after the first step") would not fix it."""

    name = "harness.engines.heldout:RecurrentStateNormed"
    bug_class = "draft steps >= 2 fed the normed draft output, not the pre-norm one"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised",)
    shows_in = "acceptance"
    hook = "draft_step_hidden"
    issue = "#31 (a decode-time bug outside the fc path named fc_on_recurrent_state)"

    def draft_step_hidden(self, prev_output: torch.Tensor) -> torch.Tensor:
        return self.draft.norm(prev_output)


class D2tOffsetFromNextIndex(HeldOut):
    """The draft-to-target map adds d2t[i] to i + 1 (a 1-based index where the offsets are
    0-based): every drafted token lands one target id past its own, mostly outside the draft
    vocabulary. d2t is read as offsets, so "read d2t as offsets" (the `d2t_absolute` remedy)
    would not fix it."""

    name = "harness.engines.heldout:D2tOffsetFromNextIndex"
    bug_class = "d2t offsets applied to i + 1"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised",)
    shows_in = "acceptance"
    hook = "map_draft_ids"
    issue = "#31 (a vocabulary-map bug that is not d2t read as ids)"

    def map_draft_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        ids = self.draft.to_target_ids(draft_ids) + 1
        return ids.clamp_max(self.draft.t2d.shape[0] - 1)


HELDOUT: dict[str, type[HeldOut]] = {cls.__name__: cls for cls in (
    BoundaryOneReadsEmbedding, MiddleSlotOneEarly, EmbeddingScaled, AuxBatchSizeRounding,
    RecurrentStateNormed, D2tOffsetFromNextIndex)}
