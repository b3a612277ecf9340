"""Broken draft converters, each a real file-to-file converter with one named bug, that
`convert-check` must catch with the right kind (the converter counterpart of the engine bug
zoo, harness/engines/zoo.py).

Every entry converts a SpecForge-format draft folder into a speculators-format folder (the
layout vLLM reads: top-level ids, `layers.0.*`; written by harness.golden.draft_factory's
`config_json`). `faithful` is the control: it re-expresses the source's ids in the target
engine's convention (`boundaries_to_ids`) and copies every tensor, and must be certified. Each
other entry is `faithful` with one bug seen in converters (or plausible in one), applied to the
files it writes:

- `ids-off-by-one`: every converted id one too high (a converter that adds SpecForge's +1 where
  the target reads b = id already) -> `offset +1`;
- `embedding-slot-dropped`: the slot trained on the embedding removed from the id list (a
  converter that filters "invalid" ids such as -1 or 0), fc left as is -> `embedding_missing`;
- `final-id-clipped`: an id naming the last layer's output clipped to the last layer's input (a
  converter that bounds ids by n_layer - 1) -> `final_boundary_missing`;
- `d2t-absolute`: d2t written as absolute target ids where the target reads offsets ->
  `d2t_absolute`;
- `fc-transposed`: fc.weight written transposed -> `fc_wrong`;
- `bf16-truncated`: weights narrowed to bf16 by dropping the low 16 bits (truncation, not
  rounding: up to 2u relative, beyond the u of a correct cast) -> `weight_changed`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harness.core.boundaries import boundaries_to_ids, ids_to_boundaries
from harness.golden.draft_factory import TOP_LEVEL, config_json
from harness.models.draft import SPECFORGE_LAYER, SPECULATORS_LAYER, DraftConfig


@dataclass
class Converted:
    """What `faithful` would write, for a bug to change before it is written."""

    config: dict
    state: dict[str, torch.Tensor]
    training_boundaries: list[int]
    num_layers: int
    convention: str


Bug = Callable[[Converted], None]


@dataclass(frozen=True)
class ZooConverter:
    name: str
    bug: Bug
    expected_kind: str  # the kind convert-check must name ("ok": certified)
    draft: str  # the bundle draft it is shown on (the bug must matter there)
    to_convention: str  # the engine rule it converts for
    what: str
    expected_offset: int | None = None


def faithful_conversion(source: Path, target: Path, trainer: str, convention: str) -> Converted:
    """The source draft re-expressed for `convention`: ids naming training's boundaries there,
    every tensor as stored, keys in speculators' layout."""
    cfg = DraftConfig.from_json(json.loads((source / "config.json").read_text(encoding="utf-8")))
    n = int(json.loads((target / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
    train = list(ids_to_boundaries(cfg.aux_layer_ids, trainer, n))
    ids = boundaries_to_ids(train, convention, n)
    config = config_json(replace(cfg, aux_layer_ids=ids), TOP_LEVEL, verifier=str(target))
    state = {(SPECULATORS_LAYER + k[len(SPECFORGE_LAYER):] if k.startswith(SPECFORGE_LAYER) else k): v
             for k, v in load_file(str(source / "model.safetensors")).items()}
    return Converted(config, state, train, n, convention)


def convert(entry: ZooConverter, source: Path, out: Path, target: Path, trainer: str) -> Path:
    """Run one zoo converter: `source` (SpecForge format) -> `out` (speculators format)."""
    conv = faithful_conversion(source, target, trainer, entry.to_convention)
    entry.bug(conv)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in conv.state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(conv.config, indent=2) + "\n", encoding="utf-8")
    return out


def _ids(c: Converted) -> list[int]:
    return list(c.config["eagle_aux_hidden_state_layer_ids"])


def _set_boundaries(c: Converted, boundaries: list[int]) -> None:
    c.config["eagle_aux_hidden_state_layer_ids"] = list(boundaries_to_ids(boundaries, c.convention,
                                                                          c.num_layers))


def _no_bug(c: Converted) -> None:
    """The control: nothing changed."""


def _off_by_one(c: Converted) -> None:
    c.config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in _ids(c)]


def _drop_embedding(c: Converted) -> None:
    _set_boundaries(c, [b for b in c.training_boundaries if b != 0])


def _clip_final(c: Converted) -> None:
    _set_boundaries(c, [min(b, c.num_layers - 1) for b in c.training_boundaries])


def _d2t_absolute(c: Converted) -> None:
    d2t = c.state["d2t"]
    c.state["d2t"] = d2t + torch.arange(d2t.numel(), dtype=d2t.dtype)


def _fc_transposed(c: Converted) -> None:
    c.state["fc.weight"] = c.state["fc.weight"].T.contiguous()


def _bf16_truncated(c: Converted) -> None:
    for k, v in c.state.items():
        if v.dtype == torch.float32:
            bits = v.contiguous().view(torch.int32) & ~0xFFFF  # keep the top 16 bits: truncation
            c.state[k] = bits.view(torch.float32).to(torch.bfloat16)  # exact: already bf16 values
    c.config["torch_dtype"] = "bfloat16"


ZOO: dict[str, ZooConverter] = {z.name: z for z in [
    ZooConverter("faithful", _no_bug, "ok", "specforge-default", "vllm-llama",
                 "re-expresses the ids in the target's rule, copies every tensor (the control)"),
    ZooConverter("ids-off-by-one", _off_by_one, "offset", "specforge-default", "vllm-llama",
                 "every converted id one too high", expected_offset=1),
    ZooConverter("embedding-slot-dropped", _drop_embedding, "embedding_missing", "embed-first",
                 "vllm-llama", "the id of the embedding slot removed, fc left as is"),
    ZooConverter("final-id-clipped", _clip_final, "final_boundary_missing", "final-aux",
                 "vllm-llama", "the last layer's output clipped to the last layer's input"),
    ZooConverter("d2t-absolute", _d2t_absolute, "d2t_absolute", "specforge-default", "vllm-llama",
                 "d2t written as absolute target ids where offsets are read"),
    ZooConverter("fc-transposed", _fc_transposed, "fc_wrong", "specforge-default", "vllm-llama",
                 "fc.weight written transposed"),
    ZooConverter("bf16-truncated", _bf16_truncated, "weight_changed", "specforge-default",
                 "vllm-llama", "weights narrowed to bf16 by truncation instead of rounding"),
]}
