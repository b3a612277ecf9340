"""The bug zoo: the reference engine with one real-world EAGLE-3 wiring bug each.

The suite is only as good as the bugs it catches, so every bug class in DESIGN.md that has
bitten a public engine lives here as a `ReferenceEngine` subclass that overrides ONE wiring
hook of `harness.engines.speculative.Eagle3Runtime`. Everything else (loading, decoding,
losslessness) is the reference's, so a mutant differs from training by exactly its bug and
`eagle3-conformance selftest` can demand that the suite (a) fails it and (b) names it: each
mutant states the `harness.diagnosis.record.KINDS` entry a correct diagnosis must produce.

The bundle's drafts decide what can show: specforge-default trains boundaries [2, 4, 5],
embed-first [0, 4, 6], single-aux [4], final-aux [2, 4, 8] (N = 8). A mutant applies its bug
exactly where the real engine has it (a final-boundary bug only at b = N), so it may leave
some drafts untouched, but never every bundle draft (tests/test_zoo.py checks that).

Resolved by `harness.run.registry` as `zoo:<key>` with <key> a key of `MUTANTS`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch

from harness.core.boundaries import Convention, get_convention
from harness.engines.reference import ReferenceEngine
from harness.models.draft import DraftKV
from harness.models.residual import TargetStates
from harness.models.target import decoder_layers


class Mutant(ReferenceEngine):
    """What every mutant declares, and the few helpers they share (no mutant repeats another's
    arithmetic). Not itself a mutant: it has no bug."""

    name: ClassVar[str]
    bug_class: ClassVar[str]  # one line, as selftest.json prints it
    expected_diagnosis_kind: ClassVar[str]  # a key of harness.diagnosis.record.KINDS
    # bundle drafts on which the same bug has another root cause, and its kind (the selftest
    # expects that kind of the diagnoses of those drafts' checks)
    expected_kind_by_draft: ClassVar[dict[str, str]] = {}
    hook: ClassVar[str]  # the one Eagle3Runtime hook the mutant overrides
    issue: ClassVar[str]  # the public report(s) of the bug, also cited in the docstring
    # A check-id prefix: the selftest counts the mutant caught only if a check it names failed
    # (None: any check). Set for bugs only a particular check can see, or one check must see
    # whatever the dtype (the decode-time and history mutants).
    caught_by: ClassVar[str | None] = None
    # what the bug changes: "wiring" (what the draft sees or proposes) or "throughput" (only
    # how long speculation takes; tests/test_zoo.py checks each kind its own way)
    observable: ClassVar[str] = "wiring"
    # dtypes in which the bug is no bug (rounding aux states to bf16 inside a bf16 engine
    # changes nothing): the selftest runs it there as not applicable, named, not as missed
    no_bug_in_dtypes: ClassVar[tuple[str, ...]] = ()

    def trained_boundaries(self) -> tuple[int, ...]:
        """What training put in each slot: the reference's reading of the ids."""
        return tuple(ReferenceEngine.capture_boundaries(self))

    def shifted(self, k: int) -> tuple[int, ...]:
        """Every trained boundary moved by k, kept on the stream (0..N): an engine cannot
        capture before the embedding or after the last layer."""
        return tuple(min(max(b + k, 0), self.num_layers) for b in self.trained_boundaries())

    def unwritten(self, boundary: int, states: TargetStates) -> torch.Tensor:
        """A slot the engine never writes: its preallocated aux buffer keeps zeros (the
        TensorRT-LLM layout; an engine that concatenates a list crashes on the width instead,
        which would hide every later check)."""
        return torch.zeros_like(states.inputs[boundary])


# -- layer ids: which boundaries fill the slots (capture_boundaries) --------------------------


class IdsMinusOne(Mutant):
    """Layer ids read one boundary too early: the engine takes id k as the INPUT of layer k
    (b = k) where training meant its output (b = k + 1), while still honouring "-1 = the
    embedding". The confusion of `output_hidden_states` indices with layer indices discussed
    in NickL77/BaldEagle#18 and SafeAILab/EAGLE#239, and the one-layer drift between SpecForge
    versions fixed in sgl-project/SpecForge PR #240. specforge-default [2,4,5] -> [1,3,4]
    (offset -1), single-aux [4] -> [3]; embed-first keeps its embedding slot: [0,3,5]."""

    name = "zoo:ids_minus_one"
    bug_class = "layer ids off by one (-1): id k read as boundary k, training meant k+1"
    expected_diagnosis_kind = "offset"
    hook = "capture_boundaries"
    issue = "NickL77/BaldEagle#18; SafeAILab/EAGLE#239; sgl-project/SpecForge PR #240"

    def capture_boundaries(self) -> Sequence[int]:
        return self.shifted(-1)


class IdsPlusOne(Mutant):
    """Layer ids shifted one boundary too deep: the draft config already names boundaries and
    the engine adds its "output of layer id" +1 on top. sgl-project/sglang#32226 (fixed by PR
    #32334): gpt-oss-120b-Eagle3-v3 asked for boundaries [24, 30, 36] and SGLang captured
    [25, 31, 37]; PR #25454 made the +1 conditional for the same reason (Kimi-K2.5 draft lost
    ~0.1 accept length). Every slot one later: [3,5,6], [1,5,7], [5]."""

    name = "zoo:ids_plus_one"
    bug_class = "layer ids off by one (+1): the engine's +1 applied to ids that already name boundaries"
    expected_diagnosis_kind = "offset"
    hook = "capture_boundaries"
    issue = "sgl-project/sglang#32226 (PR #32334); sgl-project/sglang PR #25454"

    def capture_boundaries(self) -> Sequence[int]:
        return self.shifted(+1)


class VllmIdsUnshifted(Mutant):
    """vLLM's reading of the draft config's ids: passed through unchanged (b = id), and a
    negative id matching no layer, so its slot is silently dropped (vllm-project/vllm#43671:
    SpecForge ids read without their +1, position-0 acceptance 45% -> 10%). specforge-default
    [1,3,4] -> boundaries [1,3,4] (offset -1); embed-first [-1,3,5] -> [3,5], two slots for a
    three-slot fc, which crashes on the width exactly as vLLM's deepseek_v2 path does.

    Real vLLM also re-sorts the slots; that second bug is `slots_sorted`'s, not this one's: with
    both, a drawn layer-id example under vLLM's own b = id shrinks to an unsorted list (ids
    [1, 0] -> slots [0, 1]) whose only fault is the order, and the exact diagnosis score asks
    one named cause per mutant."""

    name = "zoo:vllm_ids_unshifted"
    bug_class = "ids used without the training convention's shift (vLLM: b = id)"
    expected_diagnosis_kind = "offset"
    # embed-first's -1 (training's embedding) matches no layer under b = id: that slot is
    # dropped and fc crashes on the width, the embedding missing (id 0 would feed it)
    expected_kind_by_draft: ClassVar[dict[str, str]] = {"embed-first": "embedding_missing"}
    hook = "capture_boundaries"
    issue = "vllm-project/vllm#43671"
    # vLLM's rule without its sorting, declared as such: the layer-id checks then hold the
    # mutant to b = id in config order and find it true to its claim, so its one bug shows
    # where a SpecForge draft is served (offset -1), worded with the ids that fix it
    convention: ClassVar[Convention] = replace(
        get_convention("vllm"), name="vllm-unsorted", sorts_ids=False, capture_embedding=True,
        no_embedding_reason="",
        description="vLLM 0.32's b = id (zoo:vllm_ids_unshifted), slots kept in config order, "
                    "boundary 0 captured for id 0 (vLLM's crash there is not this mutant's bug)")

    def capture_boundaries(self) -> Sequence[int]:
        return [i for i in self.layer_ids if i >= 0]


class ConfigIdsIgnored(Mutant):
    """The draft config's ids never read: the engine looks for them under another key, finds
    none, and captures its model's defaults (2, N//2, N-3). vLLM 0.32's V2 GPU model runner
    does this to every SpecForge draft: `get_eagle3_aux_layers_from_config`
    (vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) reads a top-level
    `eagle_aux_hidden_state_layer_ids` or `eagle_config["layer_ids"]`, while SpecForge nests
    `eagle_config.eagle_aux_hidden_state_layer_ids` (the V1 runner,
    vllm/v1/worker/gpu_model_runner.py, reads the nested key). vllm-project/vllm PR #50170
    measured the same silent fallback on Llama-3.3-70B: acceptance 1.2% against 58.9%.
    embed-first [0,4,6] and final-aux [2,4,8] -> [2,4,5]; single-aux gets three slots for a
    one-slot fc; SpecForge's default ids train exactly the fallback, which is why this hides."""

    name = "zoo:config_ids_ignored"
    bug_class = "draft config ids ignored; the engine captures its defaults (2, N//2, N-3)"
    expected_diagnosis_kind = "ids_ignored"
    hook = "capture_boundaries"
    issue = "vllm-project/vllm PR #50170; vllm 0.32 v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
    convention = "vllm"

    def capture_boundaries(self) -> Sequence[int]:
        return get_convention(self.convention).default_boundaries(self.num_layers)


# -- what lands in a slot (take_state) --------------------------------------------------------


class EmbeddingDropped(Mutant):
    """The embedding slot gets layer 0's output: the engine's capture adds hidden + residual,
    and before layer 0 there is no residual yet (SGLang and vLLM deepseek_v2 raise a TypeError
    there; vllm-project/vllm PR #46788 describes that capture loop), so a guarded engine
    records its first capture after layer 0. embed-first [0,4,6] -> [1,4,6]; drafts without
    the embedding are untouched."""

    name = "zoo:embedding_dropped"
    bug_class = "embedding slot (boundary 0) filled with layer 0's output (boundary 1)"
    expected_diagnosis_kind = "embedding_missing"
    hook = "take_state"
    issue = "vllm-project/vllm PR #46788 (capture before layer idx: residual is None at idx 0)"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.inputs[1] if boundary == 0 else states.inputs[boundary]


class FinalNormed(Mutant):
    """The deepest aux slot filled from the target's returned last hidden state, which is AFTER
    the final norm (HF `output_hidden_states[-1]` in transformers 5.19, llama.cpp's id N, the
    "final post-norm hidden state" gpt-oss short-context drafts are fed in sgl-project/sglang
    PR #32334, and the feature EAGLE-1/2 integrations hand over, which retrofitted EAGLE-3
    paths reuse for the "high" feature). Only boundary N is affected: final-aux [2,4,8] ->
    [2,4,normed]; the other drafts are untouched."""

    name = "zoo:final_normed"
    bug_class = "final boundary N taken after the final norm"
    expected_diagnosis_kind = "final_boundary_normed"
    hook = "take_state"
    issue = "sgl-project/sglang PR #32334 (post-norm final state); NickL77/BaldEagle#14"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.final_normed if boundary == self.num_layers else states.inputs[boundary]


class FinalMissing(Mutant):
    """The deepest boundary never captured: the engine captures only inside its layer loop and
    the capture after the loop is missing (vllm-project/vllm PR #46973: deepseek_v2 silently
    dropped the final-layer state; sgl-project/sglang#32226: "did not capture the final
    boundary"), leaving that slot of the aux buffer zero. Only boundary N is affected:
    final-aux [2,4,8] -> [2,4,zeros]; the other drafts are untouched."""

    name = "zoo:final_missing"
    bug_class = "final boundary N never captured (slot left zero)"
    expected_diagnosis_kind = "final_boundary_missing"
    hook = "take_state"
    issue = "vllm-project/vllm PR #46973; sgl-project/sglang#32226"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return self.unwritten(boundary, states) if boundary == self.num_layers else states.inputs[boundary]


class ResidualMissing(Mutant):
    """Capture without the residual: an engine that keeps `hidden_states` and `residual`
    apart (fused add-norm kernels) and records only `hidden_states`, i.e. layer k-1's MLP/MoE
    output, where training used `hidden_states + residual` (the sum every correct capture
    takes, cf. sgl-project/sglang PR #14280). "Retrieving hidden_states pre/post norm and
    residuals" is the first suspect listed for an acceptance of 1.00 in NickL77/BaldEagle#14."""

    name = "zoo:residual_missing"
    bug_class = "aux state captured without the residual (MLP output only)"
    expected_diagnosis_kind = "residual_missing"
    hook = "take_state"
    issue = "NickL77/BaldEagle#14; sgl-project/sglang PR #14280"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.mlp_out[boundary]


class MoeCaptureSkipped(Mutant):
    """Capture skipped for the MoE layers: with two-batch overlap, SGLang's deepseek_v2 runs
    the layers from first_k_dense_replace on inside the TBO region, which captured nothing
    (sgl-project/sglang PR #32680: 0 of 3 layers captured on DeepSeek-V2-Lite). A boundary
    captured before a MoE layer (or after the last, MoE, layer) leaves its slot unwritten.
    The tiny target's layer 0 is dense, so only the embedding survives: [2,4,5] -> all zero,
    [0,4,6] -> [0, zeros, zeros]."""

    name = "zoo:moe_capture_skipped"
    bug_class = "capture skipped for MoE layers (two-batch-overlap path)"
    expected_diagnosis_kind = "stale_or_skipped"
    hook = "take_state"
    issue = "sgl-project/sglang PR #32680"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        layer = min(boundary, self.num_layers - 1)  # boundary N is captured after layer N-1
        if boundary > 0 and self.layer_is_moe(layer):
            return self.unwritten(boundary, states)
        return states.inputs[boundary]


# -- how slots become the fc input (combine) --------------------------------------------------


class SlotsDescending(Mutant):
    """Slots concatenated in the engine's own boundary order, not the config's: engines fill
    slots in layer order whatever the list says (vLLM stores sorted(set(ids)), SGLang and
    vLLM deepseek_v2 append inside the layer loop, cf. vllm-project/vllm PR #30574), and this
    one walks its captures deepest first (a stack popped LIFO), so the bundle's ascending
    configs show it: [2,4,5] -> [5,4,2], [0,4,6] -> [6,4,0]."""

    name = "zoo:slots_descending"
    bug_class = "aux slots in the engine's (descending) order instead of the config order"
    expected_diagnosis_kind = "order_permuted"
    hook = "combine"
    issue = "vllm-project/vllm PR #30574 (capture order = layer order)"

    def combine(self, slots: list[torch.Tensor]) -> torch.Tensor:
        order = sorted(range(len(slots)), key=lambda i: -self.boundaries[i])
        return torch.cat([slots[i] for i in order], dim=-1)


# -- fc (project, draft_step_hidden) -----------------------------------------------------------


class FcSkippedOnWidthMatch(Mutant):
    """fc skipped whenever the aux width equals the draft hidden size: the "apply fc?" test
    `if hidden_states.shape[-1] != embeds.shape[-1]` of EAGLE-1/2 code paths
    (sgl-project/sglang PR #21272: an EAGLE-3 draft run as EAGLE, acceptance 1.00). Shows on
    single-aux, whose fc input (1 x 128) is as wide as the draft (128)."""

    name = "zoo:fc_skipped_width_match"
    bug_class = "fc skipped because fc input width == draft hidden size"
    expected_diagnosis_kind = "fc_skipped"
    hook = "project"
    issue = "sgl-project/sglang PR #21272"

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        if aux.shape[-1] == self.draft.fc.out_features:
            return aux
        return self.draft.project(aux)


class NormBeforeFcFlipped(Mutant):
    """`norm_before_fc` not honoured: the flag is lost between the checkpoint and the draft
    model. vllm-project/vllm PR #38111: `update_eagle3()` did not propagate it, so drafts
    trained with `norm_before_fc: true` (gpt-oss speculators) silently skipped the RMSNorm
    before fc. The bundle's drafts train without it, so the mutant reads the flag inverted:
    where training normed, the norm is dropped (the PR's bug); where it did not, a unit-weight
    RMSNorm runs on the concatenated aux state (an engine defaulting the flag to true, as
    EAGLE-3.1 ports do for `fc_norm`, NVIDIA/TensorRT-LLM PR #14988). Every draft shows it."""

    name = "zoo:norm_before_fc_flipped"
    bug_class = "norm_before_fc read inverted: the RMSNorm before fc dropped or added"
    expected_diagnosis_kind = "fc_wrong"
    hook = "project"
    issue = "vllm-project/vllm PR #38111; NVIDIA/TensorRT-LLM PR #14988"

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        cfg = self.draft.cfg
        if cfg.norm_before_fc:
            return self.draft.fc(aux)
        return self.draft.project(torch.nn.functional.rms_norm(aux, (aux.shape[-1],), eps=cfg.rms_norm_eps))


class FcOnRecurrentState(Mutant):
    """fc applied on every draft step, to the draft's own H-wide recurrent state too, where
    training applies it once, to the target's aux states (the fc-once design of EAGLE-3, as
    vllm-project/vllm PR #16937 implements it: later steps get the pre-norm output). The
    engine keeps one static aux-width hidden buffer (CUDA-graph style): on later steps it
    writes the H-wide state into the first H columns, the rest stay zero, and runs fc on the
    buffer; on single-aux the widths agree and fc runs on the state itself. Same family as the
    width-test bug of sgl-project/sglang PR #21272."""

    name = "zoo:fc_on_recurrent_state"
    bug_class = "fc re-applied to the draft's recurrent state on later draft steps"
    expected_diagnosis_kind = "fc_on_recurrent_state"
    hook = "draft_step_hidden"
    issue = "vllm-project/vllm PR #16937 (fc once, pre-norm fed back); sgl-project/sglang PR #21272"

    def draft_step_hidden(self, prev_output: torch.Tensor) -> torch.Tensor:
        pad = self.draft.fc.in_features - prev_output.shape[-1]
        return self.project(torch.nn.functional.pad(prev_output, (0, pad)))


# -- vocabulary map and draft cache ------------------------------------------------------------


class D2tAbsolute(Mutant):
    """d2t read as absolute target ids (`d2t[i]`) where it holds offsets (`i + d2t[i]`):
    verl-project/verl-SpeCo PR #67 (d2t defaulted to arange, i.e. read as ids, maps draft id i
    to 2i), SafeAILab/EAGLE#222, NVIDIA-NeMo/Automodel PR #2447. Drafted tokens land outside
    the draft vocabulary and are rejected; output stays lossless."""

    name = "zoo:d2t_absolute"
    bug_class = "d2t read as absolute target ids instead of offsets"
    expected_diagnosis_kind = "d2t_absolute"
    hook = "map_draft_ids"
    issue = "verl-project/verl-SpeCo PR #67; SafeAILab/EAGLE#222; NVIDIA-NeMo/Automodel PR #2447"

    def map_draft_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft.d2t[draft_ids]


class DraftKvNotRolledBack(Mutant):
    """The draft KV cache is not rolled back after a verify: the entries of drafted, rejected
    steps stay attended and the next positions continue after them (ml-explore/mlx-swift-lm
    PR #308: drafting "while cross-attending over the rejected rows"; lablup/mlxcel#994: a
    wrong draft-cache rewind starving the drafter). The first round is exact, later ones
    drift."""

    name = "zoo:draft_kv_not_rolled_back"
    bug_class = "draft KV cache and positions not rolled back after a rejection"
    expected_diagnosis_kind = "draft_kv_not_rolled_back"
    hook = "rollback"
    issue = "ml-explore/mlx-swift-lm PR #308; lablup/mlxcel#994"

    def rollback(self, kv: DraftKV, length: int) -> None:
        return None


class DecodeRowsOneLate(Mutant):
    """After each verify round the accepted positions are re-fed with the verify forward's
    features one row late: row t gets the target's features of t - 1 (the previous round's
    last row first, the last accepted row dropped); the prefill is right, so every capture
    check passes. The misalignment Copilot's review found in openvinotoolkit/openvino.genai
    PR #3396: the accepted path's indices start at the root, so hidden row i seeds token i + 1
    and the next draft window is fed one row behind."""

    name = "zoo:decode_rows_one_late"
    bug_class = "features re-fed after each verify round one row late (prefill correct)"
    expected_diagnosis_kind = "decode_misaligned"
    hook = "refeed_features"
    issue = "openvinotoolkit/openvino.genai PR #3396 (hidden rows misaligned with accepted tokens)"
    caught_by = "test_decode_inputs.py::"  # the check that sees it in every dtype

    def refeed_features(self, verified: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return torch.cat([previous, verified[:, :-1]], dim=1)


class DraftPositionsShifted(Mutant):
    """The draft's drafted steps run one position too far: the engine advances its positions
    before each draft decode forward instead of after (sgl-project/sglang PR #25015: prefill
    extend at 0..6, then draft decode at 8, 9 where 7, 8 belong; the extend after verify was
    right). Under RoPE only the distance to the fed entries moves, so the tokens stay lossless
    and acceptance drops a little: the fp32 exact trace sees it, bf16 and counters-only
    adapters did not, before the decode-input check."""

    name = "zoo:draft_positions_shifted"
    bug_class = "drafted steps' rotary positions one too far (positions advanced before the forward)"
    expected_diagnosis_kind = "draft_positions_shifted"
    hook = "draft_positions"
    issue = "sgl-project/sglang PR #25015"
    caught_by = "test_decode_inputs.py::"  # the check that sees it in every dtype

    def draft_positions(self, positions: torch.Tensor, phase: str) -> torch.Tensor:
        return positions + 1 if phase == "step" else positions


class StateLeaksBetweenRequests(Mutant):
    """The draft cache is handed from one request to the next uncleared: a slot reused without
    resetting it, as llama.cpp's ngram-cache drafter keeps a slot's context across requests
    (`begin()` a no-op, ggml-org/llama.cpp#27852: acceptance 86% -> 11%; "speculative decoding
    only works once", ggml-org/llama.cpp#19231). A new request's prefill is written after the
    previous request's entries and attends to them; what it drafts depends on what was served
    before. The cache is dropped only when the next request would not fit the draft's
    positions (a ring reset), so the leak stays bounded."""

    name = "zoo:state_leaks_between_requests"
    bug_class = "draft KV cache kept from the previous request (not cleared between requests)"
    expected_diagnosis_kind = "history_dependent"
    hook = "draft_cache"
    issue = "ggml-org/llama.cpp#27852; ggml-org/llama.cpp#19231"
    caught_by = "test_request_history.py::"  # the check that sees it in every dtype

    def draft_cache(self, needed: int) -> DraftKV:
        kv = self.__dict__.get("_leaked")
        if kv is None or kv.length + needed > self.draft.cfg.max_position_embeddings:
            kv = self.__dict__["_leaked"] = DraftKV()
        return kv


# -- bugs only id lists or layouts outside the bundle's drafts show ------------------------------
# The bundle's drafts are SpecForge-layout (nested ids), ascending, and trained in the SpecForge
# or "-1 = embedding" conventions; each mutant below is exact on all four of them and is caught
# only by suites/test_layer_ids.py (`caught_by`, which the selftest demands).


class FirstIdShiftRule(Mutant):
    """SGLang deepseek_v2's rule since sgl-project/sglang PR #25454 (prompted by a Kimi-K2.5
    acceptance loss): ids get +1 only if the first id is 1 ("output-of-layer" drafts), else
    b = id. This engine applies it to drafts it claims to read as b = id (the original EAGLE-3
    convention, vLLM's and llama.cpp's rule): a capture-before draft whose list starts at
    layer 1, [1, 5, 3], is served [2, 6, 4]. The bundle's drafts are all +1 drafts, read right."""

    name = "zoo:first_id_shift_rule"
    bug_class = "'+1 only if the first id is 1' (SGLang PR #25454) applied to b = id drafts"
    expected_diagnosis_kind = "offset"
    hook = "capture_boundaries"
    issue = "sgl-project/sglang PR #25454"
    caught_by = "test_layer_ids.py::"

    def capture_boundaries(self) -> Sequence[int]:
        trained = self.trained_boundaries()
        conv = get_convention(self.training_convention)
        if conv.offset == 0 and self.layer_ids and self.layer_ids[0] == 1:
            return tuple(min(b + 1, self.num_layers) for b in trained)
        return trained


class TopLevelIdsIgnored(Mutant):
    """Top-level ids (the speculators layout) dropped: SGLang's model runner reads only the
    nested `eagle_config.eagle_aux_hidden_state_layer_ids`, inside a bare `except`, so a
    speculators-format draft gets the model's defaults (2, N//2, N-3) silently (DESIGN.md's
    SGLang row; the converse of vLLM's V2 runner, which never reads the nested key, and of
    llama.cpp's converter, ggml-org/llama.cpp PR #27040). The same silent fallback to the
    defaults cost 1.2% acceptance against 58.9% in vllm-project/vllm PR #50170. The bundle's
    drafts are all nested, so only a speculators-layout draft shows it."""

    name = "zoo:top_level_ids_ignored"
    bug_class = "top-level (speculators) ids ignored; the engine captures its defaults (2, N//2, N-3)"
    expected_diagnosis_kind = "ids_ignored"
    hook = "capture_boundaries"
    issue = "vllm-project/vllm PR #50170 (silent fallback); sglang model_runner.py nested key only"
    caught_by = "test_layer_ids.py::"

    def capture_boundaries(self) -> Sequence[int]:
        config = json.loads((self.draft_dir / "config.json").read_text())
        if "eagle_aux_hidden_state_layer_ids" not in (config.get("eagle_config") or {}):
            return get_convention("sglang").default_boundaries(self.num_layers)
        return self.trained_boundaries()


class SlotsSorted(Mutant):
    """Slots filled in ascending boundary order, not config order: vLLM stores
    sorted(set(ids)) (`_set_aux_hidden_state_layers`), SGLang and vLLM deepseek_v2 append
    inside the layer loop, TensorRT-LLM sorts the ids; SpecForge keeps list order, so a draft
    trained with [5, 1] fed fc cat(b6, b2) and is served cat(b2, b6). Every bundle list is
    ascending, so only an unsorted list shows it (cf. zoo:slots_descending, which every
    bundle draft shows; capture order = layer order: vllm-project/vllm PR #30574)."""

    name = "zoo:slots_sorted"
    bug_class = "aux slots re-sorted ascending; the config's (unsorted) order lost"
    expected_diagnosis_kind = "order_permuted"
    hook = "capture_boundaries"
    issue = "vllm-project/vllm PR #30574 (capture order = layer order); vLLM sorted(set(ids))"
    caught_by = "test_layer_ids.py::"

    def capture_boundaries(self) -> Sequence[int]:
        return tuple(sorted(self.trained_boundaries()))
# -- throughput: the serving loop around correct wiring -------------------------------------


class ServingLoopStall(Mutant):
    """Correct wiring, full acceptance, and speculation that does not pay: each verify round
    costs its kernels plus twice as much again in the serving loop (host syncs, per-round
    scheduling, drafting without CUDA graphs). sgl-project/sglang PR #4247 measured EAGLE-3 at
    276 tok/s without CUDA graphs against 378 with; sgl-project/sglang#6949 saw 59 tok/s with
    EAGLE against 61 without at an acceptance it called fine; the motivating deployment of
    DESIGN.md served 54.8 tok/s against 90 without speculation."""

    name = "zoo:serving_loop_stall"
    bug_class = "verify rounds cost three times their kernels (serving-loop overhead)"
    expected_diagnosis_kind = "speculation_overhead"
    hook = "rollback"
    issue = "sgl-project/sglang PR #4247; sgl-project/sglang#6949"
    observable = "throughput"
    factor: ClassVar[float] = 3.0  # a round lasts this many times its own work

    def rollback(self, kv: DraftKV, length: int) -> None:
        """The rollback closes a round: stall there for (factor - 1) x the round just done."""
        super().rollback(kv, length)
        now = time.perf_counter()
        last = self.__dict__.get("_round_end")
        if last is not None and now - last < 1.0:  # within one decode, not across calls
            time.sleep((self.factor - 1) * (now - last))
        self.__dict__["_round_end"] = time.perf_counter()


class Slowdown20(ServingLoopStall):
    """A regression, not a nonconformance: every verify round 20% slower. Not in MUTANTS (no
    conformance check has a baseline to see it); benchmarks/gate_soundness.py serves it by
    dotted path (`harness.engines.zoo:Slowdown20`) to show the regression gate catches it."""

    name = "harness.engines.zoo:Slowdown20"
    bug_class = "every verify round 20% slower than the baseline"
    factor = 1.2


# -- issue #13: causes read from fitted evidence, not slot labels ---------------------------


class AuxRoundedBf16(Mutant):
    """Aux states rounded to bf16 inside an fp32 engine: the hand-off buffer between target and
    draft is allocated in a fixed half dtype whatever the model runs in (the aux buffer sized and
    typed separately from the model in sgl-project/sglang#10059, PD disaggregation's hidden-state
    transfer; the aux-buffer dtype of a draft extend built apart from the target in
    sgl-project/sglang PR #24663). Every slot is its trained boundary, rounded."""

    name = "zoo:aux_rounded_bf16"
    bug_class = "aux states rounded through a bf16 buffer inside an fp32 engine"
    expected_diagnosis_kind = "precision_loss"
    hook = "take_state"
    no_bug_in_dtypes = ("bfloat16",)
    issue = "sgl-project/sglang#10059; sgl-project/sglang PR #24663"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        return x.to(torch.bfloat16).to(x.dtype)


class AuxAfterInputNorm(Mutant):
    """Aux state captured inside the layer after its input RMSNorm, i.e. the tensor attention
    sees, where training used the un-normalised residual stream (SpecForge PR #879 fixed
    which hidden states are normalised; SafeAILab/EAGLE#91 and #233 discuss pre- vs post-norm
    features). Boundaries below N are captured normed by layer b's input norm; boundary N is
    captured after the loop, correctly."""

    name = "zoo:aux_after_input_norm"
    bug_class = "aux state captured after the layer's input norm (normalised, not the residual stream)"
    expected_diagnosis_kind = "normalised"
    hook = "take_state"
    issue = "sgl-project/SpecForge PR #879; SafeAILab/EAGLE#91; SafeAILab/EAGLE#233"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        if boundary >= self.num_layers:
            return x
        return decoder_layers(self.target)[boundary].input_layernorm(x)


class AuxResidualOnly(Mutant):
    """Only the `residual` tensor captured: with fused add-norm kernels a layer returns
    (mlp_out, residual) and the residual then holds the stream after attention, before the
    MLP's update; training's boundary is their sum (vllm-project/vllm PR #14464: a norm that
    returned `hidden` without `residual`; the broken residual path flagged in
    vllm-project/vllm PR #26164). The embedding slot has no layer before it and is right."""

    name = "zoo:aux_residual_only"
    bug_class = "aux state is the pre-MLP residual alone (a partial sum of the residual stream)"
    expected_diagnosis_kind = "partial_residual"
    hook = "take_state"
    issue = "vllm-project/vllm PR #14464; vllm-project/vllm PR #26164"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        if boundary == 0:
            return states.inputs[0]
        return states.inputs[boundary] - states.mlp_out[boundary]


class AuxBufferAliased(Mutant):
    """Every slot holds the deepest capture: the engine appends one preallocated buffer to its
    capture list and overwrites it in place at each captured layer, so all list entries alias
    the last state written (the in-place capture buffers of CUDA-graph paths; cf. the aux
    buffer reuse between prefill and decode in sgl-project/sglang#10059). [2,4,5] -> [5,5,5]."""

    name = "zoo:aux_buffer_aliased"
    bug_class = "all aux slots alias one buffer: every slot holds the last captured state"
    expected_diagnosis_kind = "slots_aliased"
    hook = "combine"
    issue = "sgl-project/sglang#10059"

    def combine(self, slots: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([slots[-1]] * len(slots), dim=-1)


class AuxRowsOneLate(Mutant):
    """Aux rows one position late: the engine pairs token t with the target's state at t - 1
    (the first row zero), the off-by-one between EAGLE's (token t+1, feature t) pairing and a
    buffer written at the token's own index (sgl-project/sglang#26163: per-token hidden
    states truncated and misattributed under speculative decoding; the hidden-state
    truncation in openvinotoolkit/openvino.genai PR #3055)."""

    name = "zoo:aux_rows_one_late"
    bug_class = "aux rows one position late (token t gets the state of token t-1)"
    expected_diagnosis_kind = "position_shifted"
    hook = "take_state"
    issue = "sgl-project/sglang#26163; openvinotoolkit/openvino.genai PR #3055"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        return torch.nn.functional.pad(x, (0, 0, 1, 0))[:, :-1]


class AuxRequestsRotated(Mutant):
    """A request gets its batch neighbour's aux rows: the aux states are gathered with the
    previous request's index (sgl-project/sglang#26163: hidden states returned under
    speculative decoding with "possible cross-request misattribution"). A batch of one is
    right, so only batched captures show it."""

    name = "zoo:aux_requests_rotated"
    bug_class = "aux rows of request i taken from request i-1 of the batch"
    expected_diagnosis_kind = "request_mixed"
    hook = "take_state"
    issue = "sgl-project/sglang#26163"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.inputs[boundary].roll(1, dims=0)


class AuxBatchLeak(Mutant):
    """A batch-wide reduction leaks into the aux states: each request's state is pulled a
    quarter of the way to the batch mean (a normalisation or padding fix-up computed over the
    whole padded batch instead of per request; batch size > 1 paths are where EAGLE ports
    break, SafeAILab/EAGLE#250 and #90). A batch of one is untouched."""

    name = "zoo:aux_batch_leak"
    bug_class = "aux states mixed with the batch mean (batch-dependent capture)"
    expected_diagnosis_kind = "batch_dependent"
    hook = "take_state"
    issue = "SafeAILab/EAGLE#250; SafeAILab/EAGLE#90"
    leak: ClassVar[float] = 0.25

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        x = states.inputs[boundary]
        return x + self.leak * (x.mean(dim=0, keepdim=True) - x)


class AuxSlotsInterleaved(Mutant):
    """Slots stacked and flattened ([T, H, n]) where training concatenates them ([T, n, H]):
    the fc input has the right width and the right numbers in the wrong layout (the
    concatenation layout every engine re-implements when it builds the fc input, cf. the
    [T, n*H] combine of vllm-project/vllm PR #16937 and the 3x-wide buffers of
    sgl-project/sglang#10059). Single-aux drafts are untouched."""

    name = "zoo:aux_slots_interleaved"
    bug_class = "aux slots interleaved: stack(-1).flatten instead of cat(-1)"
    expected_diagnosis_kind = "slots_interleaved"
    hook = "combine"
    issue = "vllm-project/vllm PR #16937; sgl-project/sglang#10059"

    def combine(self, slots: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(slots, dim=-1).flatten(-2)


MUTANTS: dict[str, type[Mutant]] = {cls.name.removeprefix("zoo:"): cls for cls in (
    IdsMinusOne,
    IdsPlusOne,
    EmbeddingDropped,
    VllmIdsUnshifted,
    ConfigIdsIgnored,
    SlotsDescending,
    FinalNormed,
    FinalMissing,
    ResidualMissing,
    FcSkippedOnWidthMatch,
    NormBeforeFcFlipped,
    FcOnRecurrentState,
    D2tAbsolute,
    DraftKvNotRolledBack,
    DecodeRowsOneLate,
    DraftPositionsShifted,
    StateLeaksBetweenRequests,
    MoeCaptureSkipped,
    ServingLoopStall,
    FirstIdShiftRule,
    TopLevelIdsIgnored,
    SlotsSorted,
    # issue #13
    AuxRoundedBf16,
    AuxAfterInputNorm,
    AuxResidualOnly,
    AuxBufferAliased,
    AuxRowsOneLate,
    AuxRequestsRotated,
    AuxBatchLeak,
    AuxSlotsInterleaved,
)}



# -- engines that misbehave outright: values no training state holds, calls that never return


class AuxBufferUnwritten(Mutant):
    """The fc input read from a buffer the capture never wrote: an engine that preallocates its
    aux-state buffer with `torch.empty` and whose capture writes to another buffer (a CUDA-graph
    buffer reference broken by an input-buffer refactor, sgl-project/sglang#21058 after
    PR #19180) hands the draft whatever that memory held, NaN included. Modelled as NaN in every
    slot: the one value every tolerance comparison used to let through (`NaN > rtol` is False)."""

    name = "zoo:aux_buffer_unwritten"
    bug_class = "aux states read from an unwritten buffer: the draft is fed NaN"
    expected_diagnosis_kind = "non_finite"
    hook = "combine"
    issue = "sgl-project/sglang#21058 (hidden-state buffer reference broken by PR #19180)"

    def combine(self, slots: list[torch.Tensor]) -> torch.Tensor:
        return torch.full_like(torch.cat(slots, dim=-1), float("nan"))


class CaptureHangs(Mutant):
    """A capture that never returns: the engine's forward blocks forever (a verify kernel
    spinning at 100% with the server never answering, sgl-project/sglang#35822; structured
    output stuck under EAGLE, sgl-project/sglang#9187). Modelled as a wait on an event that
    only `close()` sets, so the blocked thread costs no CPU and ends when the suite closes the
    engine. The suite must fail the check with a `hang` diagnosis and carry on."""

    name = "zoo:capture_hangs"
    bug_class = "an engine call never returns (the target forward blocks forever)"
    expected_diagnosis_kind = "hang"
    hook = "take_state"
    issue = "sgl-project/sglang#35822; sgl-project/sglang#9187"

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        self._released().wait()
        return states.inputs[boundary]

    def _released(self) -> threading.Event:
        return self.__dict__.setdefault("_release", threading.Event())

    def close(self) -> None:
        self._released().set()
        super().close()


MUTANTS.update({cls.name.removeprefix("zoo:"): cls for cls in (AuxBufferUnwritten, CaptureHangs)})


# -- a target placed over several processes: what reaches the drafter from other ranks -------


class CaptureShard(Mutant):
    """Rank 0 of a two-way tensor-parallel engine whose capture keeps its own shard of the
    hidden dimension (the first H/2 columns of every slot: a DTensor's `to_local()`, or a
    column-parallel output without `gather_output`) and hands it to the replicated draft
    without the all-gather. The same omission on the target's sharded logits was fixed in
    NVIDIA-NeMo/Automodel PR #2829 ("vocab-sharded (DTensor) logits ... gathers them to a full
    tensor for the draft"); issue #38 of this suite asks for the hidden-state case. fc gets
    n * H/2 columns and crashes on the width, on every bundle draft."""

    name = "zoo:capture_shard"
    bug_class = "a tensor-parallel rank's shard of each aux state handed over without the all-gather"
    expected_diagnosis_kind = "capture_shard"
    hook = "take_state"
    issue = "NVIDIA-NeMo/Automodel PR #2829 (sharded target output not gathered for the draft)"
    world_size: ClassVar[int] = 2
    shard_rank: ClassVar[int] = 0

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        return states.inputs[boundary].tensor_split(self.world_size, dim=-1)[self.shard_rank]


class CaptureMissingRank(Mutant):
    """The last stage of a two-stage pipeline, where only the last stage captures: SGLang's
    `set_eagle3_layers_to_capture` returns on every pipeline rank but the last
    (sgl-project/sglang PR #39644 proposes to refuse it), and vLLM's models return
    `IntermediateTensors` without the aux states on the others, so "the drafter receives fewer
    aux states than expected" (vllm-project/vllm PR #45985; RBLN-SW/vllm-rbln#1007). Layers
    split evenly as SGLang and transformers do ((0, N//2): boundaries below N//2 are computed
    on stage 0); the adapter declares that layout in `pipeline_stages`, as one for a pipelined
    engine would. specforge-default [2,4,5] -> [4,5], embed-first [0,4,6] -> [4,6], final-aux
    [2,4,8] -> [4,8] (fc crashes on the width); single-aux [4] lies on the last stage."""

    name = "zoo:capture_missing_rank"
    bug_class = "aux states of boundaries on pipeline stages before the last never reach the drafter"
    expected_diagnosis_kind = "capture_missing_rank"
    hook = "capture_boundaries"
    issue = "vllm-project/vllm PR #45985; sgl-project/sglang PR #39644; RBLN-SW/vllm-rbln#1007"

    @property
    def pipeline_stages(self) -> tuple[int, ...]:
        return (0, self.num_layers // 2)

    def capture_boundaries(self) -> Sequence[int]:
        last = self.pipeline_stages[-1]
        return [b for b in self.trained_boundaries() if b >= last]


MUTANTS.update({cls.name.removeprefix("zoo:"): cls for cls in (CaptureShard, CaptureMissingRank)})
