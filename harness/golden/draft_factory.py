"""Drafts for any layer-id list, in either config layout engines read, built on demand.

The bundle's drafts carry four fixed id lists, and an engine that is right on those four and
misreads any other list would pass every fixed-draft check. The layer-id check therefore
serves drafts with ids Hypothesis draws. Capture and fc checks need no *trained* draft (they
compare what the engine feeds fc, and fc's output on it, against the training reference for
the same weights), so a factory draft is the bundle's base draft with its fc replaced by one
as wide as the id count implies (`len(ids) * target_hidden`), filled deterministically from
the ids and a seed: the same request gives bit-identical files in every session.

Two layouts, because which key an engine reads is half of its layer-id convention:

- `specforge-nested`: SpecForge's `LlamaForCausalLMEagle3` config with the ids nested in
  `eagle_config.eagle_aux_hidden_state_layer_ids` (what the bundle's drafts use);
- `speculators-top-level`: vLLM's speculators format (`speculators_model_type: eagle3`, the llama
  fields under `transformer_layer_config`, the ids at the top level;
  vllm/transformers_utils/configs/speculators/algos.py `update_eagle3` reads exactly these).

Folders go to a scratch directory (never into the bundle: its manifest pins every file) and
are cached per (ids, layout) for the factory's lifetime, one session.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from harness.golden.bundle import Bundle
from harness.models.draft import DraftConfig

NESTED, TOP_LEVEL = "specforge-nested", "speculators-top-level"
FORMATS = (NESTED, TOP_LEVEL)
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
_LLAMA_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "hidden_act", "rms_norm_eps",
               "rope_theta", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
               "eos_token_id", "pad_token_id")


class DraftFactoryError(ValueError):
    """A request the factory cannot build; one line with the fix."""


def config_json(cfg: DraftConfig, layout: str, num_draft_tokens: int = 4,
                verifier: str = "target") -> dict:
    """The config.json of `cfg` in `layout` (see the module docstring)."""
    if layout not in FORMATS:
        raise DraftFactoryError(f"unknown draft config format {layout!r}; use one of {FORMATS}")
    nested = cfg.to_json()
    if layout == NESTED:
        return nested
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.1.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_draft_tokens}],
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
        "transformer_layer_config": {k: nested[k] for k in _LLAMA_KEYS if k in nested},
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        # SpecForge's draft adds the residual before its hidden norm; speculators' default is
        # the other way round, so it is written out.
        "norm_before_residual": False,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "torch_dtype": "float32",
    }


def _seed_for(ids: Sequence[int], seed: int) -> int:
    return zlib.crc32(json.dumps([list(ids), seed]).encode())


class DraftFactory:
    """Draft folders for (ids, layout) derived from one bundle draft (`base`, default the
    first whose fc has no norms, so the only thing that changes is fc's width)."""

    def __init__(self, bundle: Bundle, scratch: Path, base: str | None = None, seed: int = 0) -> None:
        scratch = Path(scratch)
        if scratch.resolve().is_relative_to(Path(bundle.path).resolve()):
            raise DraftFactoryError(f"scratch folder {scratch} is inside the bundle {bundle.path}, "
                                    f"whose manifest pins every file; use a temporary folder")
        self.bundle = bundle
        self.scratch = scratch
        self.seed = seed
        self.base = base or next((n for n in bundle.draft_names
                                  if not self._base_config(n).fc_norm
                                  and not self._base_config(n).norm_before_fc), bundle.draft_names[0])
        self._built: dict[tuple[tuple[int, ...], str], Path] = {}
        self._remedied: dict[tuple, Path] = {}

    def _base_config(self, name: str) -> DraftConfig:
        return DraftConfig.from_json(json.loads((self.bundle.draft_dir(name) / "config.json").read_text()))

    def folder(self, ids: Sequence[int], layout: str = NESTED) -> Path:
        """The draft folder for these ids (any ints, in this order: invalid lists are built too,
        so the config lint and the engines can be shown them) in this layout."""
        ids = tuple(int(i) for i in ids)
        if not ids:
            raise DraftFactoryError("a draft needs at least one layer id")
        if layout not in FORMATS:
            raise DraftFactoryError(f"unknown draft config format {layout!r}; use one of {FORMATS}")
        key = (ids, layout)
        if key not in self._built:
            self._built[key] = self._write(ids, layout)
        return self._built[key]

    def remedied(self, draft: str, ids: Sequence[int], layout: str = NESTED,
                 slot_order: Sequence[int] | None = None) -> Path:
        """A copy of the bundle draft `draft`, its trained weights kept, with its config's ids
        set to `ids` in `layout`, and where `slot_order` is given fc's input column blocks (and
        the per-slot and whole-input norms before fc) permuted so that the copy's slot j is the
        original's slot slot_order[j]: the remedy of a diagnosis, re-served
        (harness.diagnosis.remedy)."""
        ids = tuple(int(i) for i in ids)
        order = None if slot_order is None else tuple(int(p) for p in slot_order)
        cfg = self._base_config(draft)
        if order is not None and sorted(order) != list(range(cfg.num_aux)):
            raise DraftFactoryError(f"slot order {list(order)} is no permutation of {cfg.num_aux} slots")
        key = (("remedy", draft, order), ids, layout)
        if key not in self._remedied:
            if layout not in FORMATS:
                raise DraftFactoryError(f"unknown draft config format {layout!r}; use one of {FORMATS}")
            state = load_file(str(self.bundle.draft_dir(draft) / "model.safetensors"))
            if order is not None:
                width = cfg.target_hidden_size

                def blocks(t: torch.Tensor) -> torch.Tensor:
                    return torch.cat([t[..., p * width:(p + 1) * width] for p in order], dim=-1)

                state["fc.weight"] = blocks(state["fc.weight"])
                if "input_norm.weight" in state:
                    state["input_norm.weight"] = blocks(state["input_norm.weight"])
                old = {p: state[f"fc_norm.{p}.weight"] for p in order if f"fc_norm.{p}.weight" in state}
                for j, p in enumerate(order):
                    if p in old:
                        state[f"fc_norm.{j}.weight"] = old[p]
            name = (f"remedy-{draft}-ids_" + "_".join(str(i).replace("-", "m") for i in ids)
                    + ("" if order is None else "-order_" + "_".join(map(str, order))) + f"-{layout}")
            folder = self.scratch / name
            folder.mkdir(parents=True, exist_ok=True)
            save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
            (folder / "config.json").write_text(json.dumps(config_json(
                replace(cfg, aux_layer_ids=ids), layout,
                verifier=str(self.bundle.target_dir.resolve())), indent=2) + "\n")
            self._remedied[key] = folder
        return self._remedied[key]

    def _write(self, ids: tuple[int, ...], layout: str) -> Path:
        base_dir = self.bundle.draft_dir(self.base)
        cfg = replace(self._base_config(self.base), aux_layer_ids=ids)
        state = load_file(str(base_dir / "model.safetensors"))
        fc = state["fc.weight"]
        gen = torch.Generator().manual_seed(_seed_for(ids, self.seed))
        # the base fc's scale, so fc's output has the magnitude the draft layer was trained on
        state["fc.weight"] = (torch.randn(fc.shape[0], len(ids) * cfg.target_hidden_size, generator=gen)
                              * fc.float().std()).to(fc.dtype)
        name = "ids_" + "_".join(str(i).replace("-", "m") for i in ids) + f"-{layout}"
        folder = self.scratch / name
        folder.mkdir(parents=True, exist_ok=True)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config_json(
            cfg, layout, verifier=str(self.bundle.target_dir.resolve())), indent=2) + "\n")
        return folder
