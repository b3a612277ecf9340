"""Capture faults of a target placed over several processes, read off the width the engine fed
fc (from its crash) or the width its adapter reported (from the capture), against the width
the draft's fc takes.

Two faults, each a width no single-process wiring bug produces:

- `capture_shard`: every slot 1/W as wide as the hidden state: a tensor-parallel rank's own
  shard of a hidden-sharded state (a DTensor's `to_local()`, a column-parallel output without
  `gather_output`) handed over without the all-gather. Named only where the fed width is
  exactly n * H / W for an integer W >= 2 and is NOT a whole number of H-wide slots: a whole
  number of slots is what missing or extra slots leave, and the two are then not told apart by
  width (the diagnosis stays the crash's own, worded ambiguous with capture_shard:
  harness.diagnosis.crash).
- `capture_missing_rank`: the slots of the boundaries computed on a pipeline stage before the
  last are missing: SGLang returns from `set_eagle3_layers_to_capture` on every pipeline rank
  but the last, and vLLM's models return `IntermediateTensors` without the aux states there
  (vllm-project/vllm PR #45985), so the drafter on the last stage gets only the last stage's
  boundaries. Named where the adapter reported nothing at all (a rank other than the last), or
  where the engine declares its pipeline stages (`Engine.pipeline_stages`) and the fed width is
  exactly the last stage's training boundaries; without the declaration fewer slots are the
  crash diagnosis' "some ids match no captured layer", never a guess at a pipeline.

Boundary b is computed on the stage that runs layer b (its input) and b = N on the last stage,
so a stage starting at layer s holds boundaries s .. (next start); the first stage also holds
b = 0. Both remedies are the engine vendor's: no id list fixes a placement.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.diagnosis.record import Diagnosis


def last_stage_boundaries(training_boundaries: Sequence[int],
                          pipeline_stages: Sequence[int]) -> tuple[list[int], list[int]]:
    """(the training boundaries the last pipeline stage computes, the ones earlier stages do),
    each in slot order; `pipeline_stages`: the first decoder layer of each stage, ascending."""
    last = int(pipeline_stages[-1])
    return ([int(b) for b in training_boundaries if b >= last],
            [int(b) for b in training_boundaries if b < last])


def shard_world(fed_width: int, fc_width: int, hidden: int) -> int | None:
    """The tensor-parallel world size W >= 2 for which `fed_width` is every one of fc's slots cut
    to its 1/W shard (fed x W = fc's width, W dividing the hidden size), else None. Whether the
    width is also a whole number of slots, which makes it ambiguous, is the caller's question."""
    if fed_width <= 0 or fc_width % fed_width:
        return None
    world = fc_width // fed_width
    return world if world >= 2 and hidden % world == 0 else None


def _diagnosis(kind: str, message: str, training_boundaries: Sequence[int] | None,
               details: dict) -> Diagnosis:
    return Diagnosis(kind=kind, message=message, engine_boundaries=[],
                     training_boundaries=list(training_boundaries or []), suggested_layer_ids=None,
                     details={**details, "addressee": "engine vendor",
                              # the width is exact evidence: no other known cause leaves it
                              "confidence_margin": float("inf")})


def placement_diagnosis(fed_width: int, fc_width: int, hidden: int, *, source: str,
                        training_boundaries: Sequence[int] | None = None,
                        pipeline_stages: Sequence[int] | None = None) -> Diagnosis | None:
    """`capture_shard` or `capture_missing_rank` where the widths show one, else None.
    `source`: what the width is, in words ("the engine fed fc" / "the adapter reported"), with
    the crash's first line where it came from a crash."""
    if hidden <= 0 or fc_width <= 0 or fc_width % hidden or fed_width >= fc_width:
        return None
    slots = fc_width // hidden
    widths = {"fed_width": fed_width, "fc_width": fc_width, "hidden_size": hidden}
    if fed_width == 0:
        return _diagnosis("capture_missing_rank", (
            f"root cause: capture_missing_rank — {source} no aux state at all where the draft's fc "
            f"takes {slots} x {hidden}: what a pipeline rank other than the last reports (SGLang and "
            "vLLM capture nothing there; the drafter runs on the last stage). Fix (engine vendor): "
            "read the capture on the last pipeline stage, with every boundary computed on an earlier "
            "stage sent to it. Confidence margin: exact (no feature at all)."),
            training_boundaries, widths)
    if pipeline_stages and training_boundaries:
        kept, missing = last_stage_boundaries(training_boundaries, pipeline_stages)
        if missing and fed_width == len(kept) * hidden:
            return _diagnosis("capture_missing_rank", (
                f"root cause: capture_missing_rank — {source} {len(kept)} aux states where the "
                f"draft's fc takes {slots}: exactly the training boundaries {kept} that the last of "
                f"the engine's pipeline stages (first layers {list(pipeline_stages)}) computes; "
                f"boundaries {missing} are computed on an earlier stage, whose capture never reaches "
                "the drafter (SGLang captures only on the last pipeline rank). Fix (engine vendor): "
                "send each captured boundary from the stage that computes it to the last stage "
                "(vLLM PR #45985 carries them in the pipeline's intermediate tensors). "
                "Confidence margin: exact (the width is the last stage's slots)."),
                training_boundaries, {**widths, "last_stage_boundaries": kept,
                                      "missing_boundaries": missing,
                                      "pipeline_stages": list(pipeline_stages)})
    if fed_width % hidden and (world := shard_world(fed_width, fc_width, hidden)) is not None:
        return _diagnosis("capture_shard", (
            f"root cause: capture_shard — {source} {fed_width} columns where the draft's fc takes "
            f"{fc_width} = {slots} x {hidden}: {slots} slot{'s' * (slots != 1)} of {hidden // world} columns, 1/{world} "
            f"of the hidden size each, no whole number of slots. That is one tensor-parallel rank's "
            f"shard of the residual stream (world size {world}) handed over without its all-gather. "
            "Fix (engine vendor): capture the gathered state (all-gather across the "
            "tensor-parallel group, or capture where the residual stream is replicated, after the "
            "row-parallel all-reduce). Confidence margin: exact (the width divides only as shards)."),
            training_boundaries, {**widths, "world_size": world})
    return None
