"""Reading a cause out of an engine's error message: an engine that fails on a draft is
nonconformant too, and its error often shows why (a matmul shape error that counts the aux
slots fc was fed). The caller holds the draft's spec and passes its ids; no config is
re-read here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.core.boundaries import Convention, LayerIdError, boundaries_to_ids, get_convention
from harness.diagnosis.placement import placement_diagnosis, shard_world
from harness.diagnosis.record import Diagnosis

_SHAPES = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
# the same mismatch met where the drafter first reshapes its aux input to fc's width (vLLM 0.32
# on the CPU of an AMD EPYC machine, 2026-12-02; the matmul error above on the build machine):
# the fed width is then not in the message, only that the rows do not divide into fc's width
_VIEW = re.compile(r"shape '\[-1, (\d+)\]' is invalid for input of size (\d+)")
# the same mismatch met in vLLM's own CPU GEMM (its sgl-kernel `weight_packed_linear`, which
# vLLM 0.32 picks for a bf16 fc on a CPU with AMX tiles: an Intel Xeon CI machine, 2026-12-03):
# fed width, then fc's input width
_KERNEL = re.compile(r"CHECK_EQ\(mat1\.size\(ndim - 1\), K\) failed\. (\d+) vs (\d+)")
# llama.cpp (11434.0.0) refusing a wiring it has no way to serve, in its own words: the target
# graph records no layer input (llama-graph.cpp set_outputs asserts `t_layer_inp[il]`; every
# deepseek2 target, the committed bundle's included), or the draft's aux count is not the 3
# its EAGLE-3 path takes (common/speculative.cpp)
_NO_LAYER_INPUT = re.compile(r"layer input tensor is null|layer input tensor not found")
_NOT_THREE = re.compile(r"draft model is not eagle3 \(expected 3 extract layers, got (\d+)\)")
# the same rule met at load (src/models/eagle3.cpp): a GGUF whose target_layers count is not 3,
# or (its converter writing its 3 default ids where the config's are nested) an fc whose input
# width is not 3 slots: "expected <3 x H>, <H'>, got <fc in>, <H'>"
_NOT_THREE_AT_LOAD = re.compile(r"EAGLE3 requires exactly 3 entries in 'extract_layers'")
_FC_SHAPE = re.compile(r"tensor 'fc\.weight' has wrong shape; expected\s+(\d+),\s+\d+, got\s+(\d+),")


def _slots_at_load(message: str, config_ids: Sequence[int], target_hidden: int) -> int | None:
    """The draft's aux count where llama.cpp refused it at load for not being 3, else None."""
    if _NOT_THREE_AT_LOAD.search(message):
        return len(config_ids)
    if (m := _FC_SHAPE.search(message)) and int(m.group(1)) == 3 * target_hidden \
            and int(m.group(2)) % target_hidden == 0 and int(m.group(2)) != 3 * target_hidden:
        return int(m.group(2)) // target_hidden
    return None


def _cannot_express(message: str, first: str, training_boundaries: Sequence[int] | None,
                    config_ids: Sequence[int] = (), target_hidden: int = 0) -> Diagnosis | None:
    """`engine_cannot_express`: the engine refused the draft's wiring by a rule of its own,
    so no id list and no engine setting serves it as trained there; None for other errors."""
    m = _NOT_THREE.search(message)
    slots = int(m.group(1)) if m else (_slots_at_load(message, config_ids, target_hidden)
                                       if target_hidden else None)
    if _NO_LAYER_INPUT.search(message):
        why = ("this target's graph records no layer input to extract (llama.cpp sets "
               "t_layer_inp in the llama, qwen3, qwen3moe, openai-moe, minimax-m2, deepseek4 ... "
               "graphs, not deepseek2's) and the engine aborts before any state reaches the draft")
        fix = ("no layer ids fix it: serve this draft with another engine, or the engine must "
               "record layer inputs in this architecture's graph")
    elif slots is not None:
        why = f"the engine's EAGLE-3 path takes exactly 3 aux layers and this draft has {slots}"
        fix = "no layer ids fix it: retrain the draft with 3 aux layers, or serve it elsewhere"
    else:
        return None
    return Diagnosis(kind="engine_cannot_express", message=(
        f"the engine cannot express this draft's wiring: {why}; {fix}. Engine error: {first}"),
        engine_boundaries=[], training_boundaries=list(training_boundaries or []),
        suggested_layer_ids=None)


def _embedding_ids(engine_convention: str | Convention | None, training_boundaries: Sequence[int] | None,
                   num_layers: int | None) -> tuple[int, ...] | None:
    """The ids with which the engine's declared rule captures the training boundaries, where
    that rule can capture the embedding at all; None where it cannot or is not known."""
    if engine_convention is None or training_boundaries is None or num_layers is None:
        return None
    conv = get_convention(engine_convention)
    if not conv.capture_embedding:
        return None
    try:
        return boundaries_to_ids(training_boundaries, conv, num_layers)
    except LayerIdError:
        return None


def _fed_text(fed: int | None) -> str:
    return f"{fed} aux states" if fed is not None else "a width that is not a whole number of its slots"


def _slots_missing(fed: int | None, want: int, first: str, widths: tuple[int, int] | None,
                   hidden: int, training_boundaries: Sequence[int] | None) -> Diagnosis:
    """Fewer whole slots than fc takes, no id of the config negative: some ids matched no
    captured layer, which ones the crash does not say. Where the same width is also every slot
    cut to a tensor-parallel shard (2 slots of H/2 = 1 slot of H: zoo:capture_shard on a
    two-id draft), the width cannot tell the two apart (harness.diagnosis.placement names
    capture_shard only where no whole number of slots fits): the diagnosis says so, with what
    separates them, and a decisive capture_shard of another list of the same verdict settles
    it (harness.diagnosis.compare.settled)."""
    fed_text = _fed_text(fed)
    details: dict = {"fed_slots": fed, "fc_slots": want}
    world = shard_world(widths[0], widths[1], hidden) if widths else None
    if world is None:
        return Diagnosis(kind="engine_crash", message=(
            f"the engine fed fc {fed_text} where the draft's fc takes {want} (some ids match no "
            f"captured layer; the crash does not say which) and crashed: {first}."),
            engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None, details=details)
    assert widths is not None  # a shard is read off the widths
    part = hidden // world
    return Diagnosis(kind="engine_crash", message=(
        f"ambiguous: the engine fed fc {widths[0]} columns where the draft's fc takes {widths[1]} "
        f"= {want} x {hidden}, and crashed: {first}. That width fits two causes the crash cannot "
        f"separate: {fed_text} of its {want} (some ids match no captured layer), or all {want} "
        f"slots at {part} columns each, one tensor-parallel rank's shard (world size {world}) "
        f"handed over without its all-gather (capture_shard). What separates them: the per-slot "
        f"width of the capture itself ({hidden} columns a whole slot, {part} a shard), or a "
        f"draft whose slot count is not a multiple of {world}, whose shard is no whole number of "
        f"slots. Confidence margin: 1.0 (the width fits both)."),
        engine_boundaries=[], training_boundaries=list(training_boundaries or []),
        suggested_layer_ids=None,
        details={**details, "ambiguous_with": "capture_shard", "world_size": world,
                 "confidence_margin": 1.0})


def crash_diagnosis(message: str, config_ids: Sequence[int], target_hidden: int, *,
                    engine_convention: str | Convention | None = None,
                    training_boundaries: Sequence[int] | None = None,
                    num_layers: int | None = None,
                    pipeline_stages: Sequence[int] | None = None) -> Diagnosis:
    """An engine that fails on a draft is nonconformant too; name why where the error shows it.

    A matmul shape error whose fed width is a multiple of the target hidden size smaller than
    fc's input means aux slots went missing: an id matched no layer (a negative id, e.g. the
    "-1 = embedding" style, in an engine that has no such id). Where the engine declares a
    rule that can capture the embedding (`engine_convention`, with the draft's training
    boundaries), the ids that feed it under that rule are the fix; else no id list is."""
    first = message.strip().splitlines()[0] if message.strip() else "engine failure"
    refused = _cannot_express(message, first, training_boundaries, config_ids, target_hidden)
    if refused is not None:
        return refused
    fed: int | None = None
    want: int | None = None
    # (fed width, fc's input width), from whichever wording of the fc width error this is
    widths: tuple[int, int] | None = None
    if m := _SHAPES.search(message):
        widths = (int(m.group(2)), int(m.group(3)))
    elif k := _KERNEL.search(message):
        widths = (int(k.group(1)), int(k.group(2)))
    placed = widths and placement_diagnosis(
        widths[0], widths[1], target_hidden, source=f"the engine crashed ({first}): it fed fc",
        training_boundaries=training_boundaries, pipeline_stages=pipeline_stages)
    if placed:
        return placed
    if widths and widths[0] % target_hidden == 0 and widths[1] % target_hidden == 0:
        fed, want = widths[0] // target_hidden, widths[1] // target_hidden
    v = None if widths else _VIEW.search(message)
    if v and int(v.group(1)) % target_hidden == 0 and int(v.group(2)) % int(v.group(1)) != 0:
        want = int(v.group(1)) // target_hidden  # fed: some other number of slots
    dropped = [i for i in config_ids if i < 0]
    if want is not None and (fed is None and dropped or fed is not None and fed < want):
        if not dropped:
            return _slots_missing(fed, want, first, widths, target_hidden, training_boundaries)
        fed_text = _fed_text(fed)
        fix = _embedding_ids(engine_convention, training_boundaries, num_layers)
        remedy = (f"this engine's rule ({get_convention(engine_convention).name}) captures it "
                  f"with ids {list(fix)}: set the draft's ids to {list(fix)} for this engine"
                  if fix is not None else "this engine cannot express it with these ids")
        return Diagnosis(kind="embedding_missing", message=(
            f"the engine fed fc {fed_text} where the draft's fc takes {want} (ids {dropped} match "
            f"no layer in this engine, so their slots are dropped) and crashed: {first}. Training "
            f"fed the embedding output there; {remedy}."),
            engine_boundaries=[], training_boundaries=list(training_boundaries or []),
            suggested_layer_ids=list(fix) if fix is not None else None,
            details={"fed_slots": fed, "fc_slots": want})
    if fed is not None and want is not None:
        if fed > want:
            return Diagnosis(kind="ids_ignored", message=(
                f"the engine fed fc {fed} aux states where the draft's fc takes {want} and crashed: "
                f"{first}. It captured more layers than the config's ids {list(config_ids)} name, "
                f"so it took its layer list from elsewhere (an engine that ignores the ids captures "
                f"its default three)."), engine_boundaries=[], training_boundaries=[],
                suggested_layer_ids=None, details={"fed_slots": fed, "fc_slots": want})
    return Diagnosis(kind="engine_crash", message=f"the engine failed serving this draft: {first}",
                     engine_boundaries=[], training_boundaries=[], suggested_layer_ids=None)
