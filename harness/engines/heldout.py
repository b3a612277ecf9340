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
    # "capture", "batch", "acceptance", "fc" (suites/test_fc_projection.py's judgement),
    # "decode" (suites/test_decode_inputs.py's) or "history" (suites/test_request_history.py's)
    shows_in: ClassVar[str]
    # other checks that fail it too (benchmarks/diagnosis_scan.py judges it there as well)
    also_shows_in: ClassVar[tuple[str, ...]] = ()


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


# -- decode feeds, draft positions, vocabulary map, request history (issue #31 item 6) ---------


class RefeedBonusRowStale(HeldOut):
    """After a verify round the engine copies the accepted drafted rows of the verify output
    (a of them) into the draft's feature buffer and re-feeds a + 1 positions: the bonus token's
    row is never written and keeps what the buffer held, the last row fed before the round (an
    off-by-one between "accepted" and "accepted + bonus" in the copy length). Positions and the
    prefill are right; only the last re-fed row of each round is stale."""

    name = "harness.engines.heldout:RefeedBonusRowStale"
    bug_class = "the bonus row of each re-feed left stale (the previous round's last row)"
    expected_diagnosis_kind = "decode_misaligned"
    acceptable = ("decode_misaligned", "unrecognised")
    shows_in = "decode"
    hook = "refeed_features"
    issue = "#31 item 6 (a decode-feed row taken from the wrong row)"

    def refeed_features(self, verified: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return torch.cat([verified[:, :-1], previous], dim=1)


class RefeedPathReversed(HeldOut):
    """The accepted path's rows gathered leaf to root (a tree verifier walking parent pointers
    back from the accepted leaf and never reversing the list), so the re-fed rows of a round
    come in reverse order: position p gets the features of p + a. A round that accepted nothing
    re-feeds one row and is right; positions and the prefill are right."""

    name = "harness.engines.heldout:RefeedPathReversed"
    bug_class = "the rows re-fed after a verify round in reverse order (accepted path leaf to root)"
    expected_diagnosis_kind = "decode_misaligned"
    acceptable = ("decode_misaligned", "unrecognised")
    shows_in = "decode"
    hook = "refeed_features"
    issue = "#31 item 6 (decode feeds: the accepted path's rows out of order)"

    def refeed_features(self, verified: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return verified.flip(1)


class DraftPositionsResetPerRound(HeldOut):
    """The draft's positions restart at 0 after every verify round: the engine numbers the
    re-fed rows (and the drafted steps after them) by their index in the verify window instead
    of the sequence position (a position buffer built per round from arange(num_accepted + 1)).
    The prefill is numbered right. Rows are right, so only the positions show it."""

    name = "harness.engines.heldout:DraftPositionsResetPerRound"
    bug_class = "draft positions reset to 0 for each verify round's re-feed and drafted steps"
    expected_diagnosis_kind = "draft_positions_shifted"
    acceptable = ("draft_positions_shifted", "unrecognised")
    shows_in = "decode"
    hook = "draft_positions"
    issue = "#31 item 6 (draft positions reset per verify round)"

    def draft_positions(self, positions: torch.Tensor, phase: str) -> torch.Tensor:
        if phase == "prefill":
            self.__dict__["_base"] = 0
        elif phase == "refeed":
            self.__dict__["_base"] = int(positions.flatten()[0])
        return positions - self.__dict__.get("_base", 0)


class RefeedPositionsFromWindowEnd(HeldOut):
    """The re-fed rows numbered back from the end of the verify window (p + k) instead of
    forward from the accepted prefix (p): right when every drafted token was accepted, off by
    the number rejected after a rejection (the engine computes the first re-fed position as
    `window_end - (accepted + 1)` with the window's, not the accepted length). The drafted steps
    continue from the re-feed's last position; rows and the prefill are right."""

    name = "harness.engines.heldout:RefeedPositionsFromWindowEnd"
    bug_class = "re-fed positions counted back from the verify window's end (off only after a rejection)"
    expected_diagnosis_kind = "draft_positions_shifted"
    acceptable = ("draft_positions_shifted", "unrecognised")
    shows_in = "decode"
    hook = "draft_positions"
    issue = "#31 item 6 (draft positions off only after a rejection)"

    def draft_positions(self, positions: torch.Tensor, phase: str) -> torch.Tensor:
        if phase == "prefill":
            self.__dict__["_shift"] = 0
        elif phase == "refeed":
            self.__dict__["_shift"] = self.options.num_draft_tokens + 1 - positions.shape[-1]
        return positions + self.__dict__.get("_shift", 0)


class D2tAppliedTwice(HeldOut):
    """The draft-to-target offsets added twice (the map applied once when the draft's logits
    are gathered and again when the drafted ids are handed to the verifier): draft id i becomes
    j + d2t[j] with j = i + d2t[i]. Ids whose offset is 0 stay right; the rest land on other
    target ids. d2t is read as offsets, so the `d2t_absolute` remedy would not fix it."""

    name = "harness.engines.heldout:D2tAppliedTwice"
    bug_class = "d2t offsets applied twice"
    expected_diagnosis_kind = "unrecognised"
    acceptable = ("unrecognised",)
    shows_in = "acceptance"
    hook = "map_draft_ids"
    issue = "#31 item 6 (a vocabulary-map bug: the map applied twice)"

    def map_draft_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        once = self.draft.to_target_ids(draft_ids).clamp_max(self.draft.d2t.shape[0] - 1)
        return self.draft.to_target_ids(once).clamp_max(self.draft.t2d.shape[0] - 1)


class PrefixCacheStaleAux(HeldOut):
    """A token-granular prefix cache (a radix cache) that keeps each request's aux states next
    to its KV: on a hit it hands back the cached request's aux rows for the whole cached length,
    not only the matched prefix. Every prompt starts with BOS, so a request gets the previous
    request's aux states past its first token: what it is fed depends on what was served
    before. Keyed on the embedding row of each batch row's first token (the tokens themselves);
    the entry is the last forward that started with the key's token, so decode-time verify
    windows (which start mid-sequence) neither hit nor replace it. In one capture batch each
    request gets the batch row before it past its first token: "every slot of a request holds
    another request's trained states at the same positions" is then what the capture check sees,
    so `request_mixed` is right of the capture (its remedy, index the batch rows per request,
    addresses the hand-over, not the cache)."""

    name = "harness.engines.heldout:PrefixCacheStaleAux"
    bug_class = "prefix cache hit hands back the previous request's aux rows past the matched prefix"
    expected_diagnosis_kind = "history_dependent"
    acceptable = ("history_dependent", "request_mixed", "unrecognised")
    shows_in = "history"
    also_shows_in = ("capture", "batch")
    hook = "take_state"
    issue = "#31 item 6 (request history: a prefix cache re-using another request's aux states)"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary].clone()
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = self.__dict__.setdefault("_prefix", {})
        emb = states.inputs[0]
        for b in range(x.shape[0]):
            hit = cache.get(boundary)
            if hit is not None and not torch.equal(hit[0], emb[b, :1]):
                continue  # another first token: a miss, the entry kept
            if hit is not None:
                n = min(x.shape[1], hit[1].shape[0])
                x[b, 1:n] = hit[1][1:n]
            cache[boundary] = (emb[b, :1].clone(), states.inputs[boundary][b].clone())
        return x


# -- batching and fc (issue #31 item 6) ---------------------------------------------------------


class LeftPaddingMaskedFullWidth(HeldOut):
    """A ragged batch left-padded (as HF `generate` pads) with its attention mask built from
    the batch's width instead of each request's length (all ones): every shorter prompt's tokens
    attend to the padding rows before them, so its aux states depend on its batch's longest
    prompt. Positions are still counted per request, and the longest prompt of a batch (no
    padding) and every prompt served alone are right: only a batch shows it. (A mask dropped
    outright hides here: transformers then reads sequence starts off the positions, which
    restart at each prompt.)"""

    name = "harness.engines.heldout:LeftPaddingMaskedFullWidth"
    bug_class = "left-padded capture batch masked as if every request were full width (padding attended)"
    expected_diagnosis_kind = "batch_dependent"
    acceptable = ("batch_dependent", "unrecognised")
    shows_in = "capture"
    also_shows_in = ("batch",)
    hook = "batch_attention_mask"
    issue = "#31 item 6 (batching: padding rows leaking into a request of a ragged batch)"
    padding_side = "left"

    def batch_attention_mask(self, mask: torch.Tensor) -> torch.Tensor | None:
        return torch.ones_like(mask)


class FcColumnBlocksReversed(HeldOut):
    """fc's weight with its input-column blocks (one per aux slot) in reverse slot order: a
    checkpoint converter that reorders fc's columns for an engine capturing deepest first, loaded
    by one that captures in config order. The capture is as trained; fc's output is not, and
    single-aux (one block) is untouched."""

    name = "harness.engines.heldout:FcColumnBlocksReversed"
    bug_class = "fc weight's per-slot column blocks in reverse order"
    expected_diagnosis_kind = "fc_wrong"
    acceptable = ("fc_wrong", "unrecognised")
    shows_in = "fc"
    hook = "project"
    issue = "#31 item 6 (fc: the weight's column blocks permuted by a converter)"

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        fc = self.draft.fc
        blocks = fc.weight.split(self.draft.cfg.target_hidden_size, dim=-1)
        saved = fc.weight.data
        fc.weight.data = torch.cat(blocks[::-1], dim=-1)
        try:
            return self.draft.project(aux)
        finally:
            fc.weight.data = saved


HELDOUT: dict[str, type[HeldOut]] = {cls.__name__: cls for cls in (
    BoundaryOneReadsEmbedding, MiddleSlotOneEarly, EmbeddingScaled, AuxBatchSizeRounding,
    RecurrentStateNormed, D2tOffsetFromNextIndex,
    # issue #31 item 6: decode feeds, positions, vocabulary map, request history
    RefeedBonusRowStale, RefeedPathReversed, DraftPositionsResetPerRound,
    RefeedPositionsFromWindowEnd, D2tAppliedTwice, PrefixCacheStaleAux,
    # batching, fc
    LeftPaddingMaskedFullWidth, FcColumnBlocksReversed)}
