"""SGLang's own `LlamaForCausalLMEagle3`, registered under its own name, plus two observers:
the draft model's input aux states and its fc output, written while the worker's recording
flag is set. Nothing the model computes changes; only this module imports SGLang's model
code, so only SGLang's scheduler process (where SGLang imports it) needs a GPU build."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3 as _SglangEagle3

_DIR = Path(os.environ.get("EAGLE3_SGLANG_CAPTURE_DIR", "."))
_FLAG = _DIR / "recording"  # harness.engines._sglang_worker.RECORDING_FLAG
_COUNTER = itertools.count()


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().cpu().contiguous()


class LlamaForCausalLMEagle3(_SglangEagle3):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._record: dict[str, torch.Tensor] | None = None
        self._path: Path | None = None
        self.model.register_forward_pre_hook(self._before_draft, with_kwargs=True)
        self.model.register_forward_hook(self._after_draft)
        self.model.fc.register_forward_hook(self._after_fc)

    def _before_draft(self, module: Any, args: tuple, kwargs: dict) -> None:
        forward_batch = kwargs.get("forward_batch", args[2] if len(args) > 2 else None)
        spec_info = getattr(forward_batch, "spec_info", None)
        hidden = getattr(spec_info, "hidden_states", None)
        self._record = None
        if hidden is not None and _FLAG.exists():
            # written at once, so a draft that then fails in fc still leaves its input
            self._record = {"in": _cpu(hidden)}
            self._path = _DIR / f"{next(_COUNTER):06d}.safetensors"
            save_file(self._record, str(self._path))

    def _after_fc(self, module: Any, args: tuple, output: torch.Tensor) -> None:
        if self._record is not None:
            self._record["out"] = _cpu(output)

    def _after_draft(self, module: Any, args: tuple, output: Any) -> None:
        if self._record is not None and self._path is not None:
            save_file(self._record, str(self._path))
            self._record = None


EntryClass = [LlamaForCausalLMEagle3]
