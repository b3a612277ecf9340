"""Running the real SpecForge (`specforge==0.2.0`) on the golden bundle (issue #36).

What runs is SpecForge's own code, imported from the installed package, never re-typed:

- capture ids: `specforge.algorithms.model_providers.resolve_eagle_capture_layers` (run
  override, else the draft's nested `eagle_config` ids, else the target default; exactly three
  non-negative ids);
- capture layers: SpecForge's offline capture backend
  (`offline_capture/sglang_backend/capture.py` `OfflineSGLangCaptureBackend.set_capture_layers`)
  hands the ids to the target's SGLang model; SpecForge pins `sglang==0.5.14` and that release's
  `DeepseekV2ForCausalLM.set_eagle3_layers_to_capture` turns them into `layers_to_capture`.
  Both functions are compiled from the installed files (tests/sglang_source.py says why: the
  modules import SGLang's CUDA-only dependency tree at import time) and called on stand-ins;
- the offline sample: `specforge.algorithms.eagle3.data.normalize_offline_sample`, then
  `specforge.modeling.target.target_head.TargetHead` (`load_weights`, `preprocess`, forward);
- the draft: `AutoDraftModel.from_config` on `load_draft_config_source`'s config, weights by
  `warm_start_draft_model` (SpecForge's warm-start path for a pretrained draft folder);
- TTT and accuracy: `specforge.algorithms.eagle3.model.OnlineEagle3Model.forward` (sdpa
  backend), whose per-step `acces` are SpecForge's training accuracy.

Two things are not SpecForge's code, and say so where they are used:

- the target forward. SGLang's model runner needs CUDA kernels (sgl-kernel, flashinfer), so the
  states SGLang's capture would take are read from transformers' `output_hidden_states` of the
  bundle's target: SGLang 0.5.14's deepseek_v2 captures, at layer i of its loop
  `for i in range(start_layer, end_layer)` with i in `layers_to_capture`, the residual after
  the layer communicator's `prepare_attn` (layers/communicator.py
  `prepare_attn_and_capture_last_layer_outputs`), i.e. the input of layer i = boundary i =
  `output_hidden_states[i]` for i < N. This is an independent path from the harness's own
  recorder (forward pre-hooks, harness/models/residual.py), so the comparison is not circular.
- the KL loss kernel. `specforge.core.loss.LogSoftmaxLoss` is a Triton kernel that needs a GPU;
  on a machine without one, `cpu_loss` routes it to SpecForge's own reference implementation
  of the same loss (`specforge.core.loss._compute_loss`, "Reference implementation"). The loss
  is not compared; the accuracies and logits are computed before it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from sglang_source import installed_function

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECFORGE_VERSION = "0.2.0"
# The folder the pinned SGLang source goes into (ignored by git); SPECFORGE_SGLANG may name
# another.
SGLANG_HOME = REPO_ROOT / ".specforge"
HOW_TO_RUN = (f"run `tox -e specforge`, or: pip install --no-deps specforge=={SPECFORGE_VERSION} "
              f"&& pip install --no-deps --target .specforge/sglang-<pin> sglang==<pin> (<pin>: "
              f"the sglang version specforge requires, 0.5.14 for {SPECFORGE_VERSION}); "
              f"scripts/test.sh does both")


def sglang_pin() -> str:
    """The sglang version the installed SpecForge requires (its own metadata), the release
    whose capture rule SpecForge's offline capture runs."""
    for req in importlib.metadata.requires("specforge") or []:
        name, _, version = req.partition("==")
        if name.strip() == "sglang" and ";" not in req:
            return version.strip()
    raise LookupError("the installed specforge names no pinned sglang release in its metadata")


def sglang_root() -> Path:
    listed = os.environ.get("SPECFORGE_SGLANG")
    return Path(listed) if listed else SGLANG_HOME / f"sglang-{sglang_pin()}"


def missing() -> str | None:
    """Why the SpecForge parity tests cannot run here (with how to run them), or None."""
    try:
        version = importlib.metadata.version("specforge")
    except importlib.metadata.PackageNotFoundError:
        return f"specforge is not installed: {HOW_TO_RUN}"
    if version != SPECFORGE_VERSION:
        return (f"specforge {version} is installed, these checks are written against "
                f"{SPECFORGE_VERSION}: {HOW_TO_RUN}")
    try:
        import specforge.algorithms.eagle3.model  # noqa: F401
    except ImportError as e:
        return f"specforge {version} does not import here ({e}): {HOW_TO_RUN}"
    root = sglang_root()
    if not (root / "sglang/srt/models/deepseek_v2.py").is_file():
        return f"the SGLang release SpecForge pins is not at {root}: {HOW_TO_RUN}"
    return None


def _site(module: Any) -> Path:
    return Path(module.__file__).resolve().parents[1]


# --- target side: ids -> layers_to_capture -> captured states -------------------------------

def specforge_ids(draft_config: dict[str, Any], target_config: Any) -> list[int]:
    """SpecForge's own resolution of a draft's capture ids (no run override). Raises SpecForge's
    ValueError where it refuses them."""
    from specforge.algorithms.model_providers import resolve_eagle_capture_layers

    cfg = SimpleNamespace(model=SimpleNamespace(aux_hidden_state_layer_ids=None))
    return resolve_eagle_capture_layers(cfg, draft_config, target_config)


def specforge_layers_to_capture(ids: Sequence[int], num_layers: int) -> list[int]:
    """SpecForge's backend `set_capture_layers(ids, capture_method="eagle3")`, handing the ids
    to SGLang's `DeepseekV2ForCausalLM.set_eagle3_layers_to_capture` of the pinned release,
    both executed from the installed files; returns the model's `layers_to_capture`."""
    import specforge

    backend_fn = installed_function(_site(specforge),
                                    "specforge/offline_capture/sglang_backend/capture.py",
                                    "OfflineSGLangCaptureBackend", "set_capture_layers")
    sglang_fn = installed_function(sglang_root(), "sglang/srt/models/deepseek_v2.py",
                                   "DeepseekV2ForCausalLM", "set_eagle3_layers_to_capture")
    model = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True),
                            config=SimpleNamespace(num_hidden_layers=num_layers),
                            model=SimpleNamespace(), capture_aux_hidden_states=False)
    model.set_eagle3_layers_to_capture = lambda layer_ids: sglang_fn(model, layer_ids)
    backend = SimpleNamespace(model_runner=SimpleNamespace(model=model))
    backend_fn(backend, list(ids), capture_method="eagle3")
    return list(model.model.layers_to_capture)


@torch.no_grad()
def captured_states(target: torch.nn.Module, prompt: Sequence[int],
                    layers: Sequence[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """What SGLang 0.5.14's capture gives SpecForge for one prompt: the loop layers i in
    `layers` (in loop order, each once), their states `output_hidden_states[i]` concatenated
    [T, n*H], and the final normed state [T, H] SpecForge stores as `hidden_state`."""
    ids = torch.tensor([list(prompt)])
    out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    num_layers = target.config.num_hidden_layers
    taken = [i for i in range(num_layers) if i in layers]
    aux = torch.cat([out.hidden_states[i][0] for i in taken], -1) if taken else torch.empty(0)
    return taken, aux.float(), out.hidden_states[-1][0].float()


# --- draft side -----------------------------------------------------------------------------

def load_draft(draft_dir: Path) -> torch.nn.Module:
    """The bundle's draft in SpecForge's EAGLE-3 draft class, loaded the way SpecForge
    warm-starts a pretrained draft folder (fp32, eval)."""
    from specforge.modeling.auto import AutoDraftModel
    from specforge.training.model_loading import load_draft_config_source, warm_start_draft_model

    config = load_draft_config_source(str(draft_dir))
    model = AutoDraftModel.from_config(config, torch_dtype=torch.float32)
    warm_start_draft_model(model, str(draft_dir), draft_config=config, strategy="eagle3")
    return model.eval()


def target_head(target_dir: Path, scratch: Path) -> torch.nn.Module:
    """SpecForge's TargetHead with the bundle target's lm_head, loaded by its own
    `load_weights`, kept in fp32. (`TargetHead.from_pretrained` casts it to bf16: the
    difference that makes is measured apart, docs/DESIGN.md "SpecForge parity".) Its loader
    needs a `*.index.json`, which a one-file checkpoint lacks, so `scratch` gets links to the
    target's files and an index naming the one file."""
    from specforge.modeling.target.target_head import TargetHead

    link_target(target_dir, scratch)
    head = TargetHead(str(scratch))
    head.load_weights(str(scratch))
    head.freeze_weights()
    return head.eval()


def link_target(target_dir: Path, scratch: Path) -> Path:
    """`scratch` holding links to the target's config and weights and a `*.index.json` naming
    the one weight file: SpecForge's TargetHead loader reads only sharded checkpoints."""
    from safetensors import safe_open

    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        link = scratch / name
        if not link.exists():
            link.symlink_to((target_dir / name).resolve())
    with safe_open(str(target_dir / "model.safetensors"), framework="pt") as f:
        weight_map = {k: "model.safetensors" for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    (scratch / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return scratch


@contextlib.contextmanager
def cpu_loss() -> Iterator[None]:
    """SpecForge's KL loss is a Triton GPU kernel: without a GPU, route it to SpecForge's own
    reference implementation of the same loss, and run its `torch.compile`d helpers eagerly
    (no inductor build on a CI machine). Restored on exit."""
    import specforge.algorithms.eagle3.model as sf_model
    from specforge.core import loss as sf_loss

    saved = sf_model.LogSoftmaxLoss
    if not torch.cuda.is_available():
        sf_model.LogSoftmaxLoss = SimpleNamespace(apply=sf_loss._compute_loss)
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        sf_model.LogSoftmaxLoss = saved


@dataclass
class TTTRun:
    """One OnlineEagle3Model.forward: the logits SpecForge computed at each TTT step [B, T, V]
    (positions past a step's last label included, as SpecForge computes them) and its per-step
    accuracies with their counts."""

    logits: list[torch.Tensor]
    acc: list[float]
    correct: list[int]
    denom: list[int]


@torch.no_grad()
def run_ttt(draft: torch.nn.Module, head: torch.nn.Module, input_ids: torch.Tensor,
            aux: torch.Tensor, final_normed: torch.Tensor, loss_mask: torch.Tensor,
            steps: int) -> TTTRun:
    """SpecForge's offline EAGLE-3 training step, forward only, on one batch of raw records
    (input_ids [B, T], aux [B, T, 3H], final_normed [B, T, H], loss_mask [B, T]):
    `normalize_offline_sample` per row, `TargetHead.preprocess` and projection, then
    `OnlineEagle3Model(length=steps).forward` with the draft's `compute_logits` recorded."""
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.algorithms.eagle3.model import OnlineEagle3Model

    length = input_ids.shape[1]
    rows = [normalize_offline_sample({"aux_hidden_state": aux[b:b + 1], "hidden_state": final_normed[b:b + 1],
                                      "input_ids": input_ids[b], "loss_mask": loss_mask[b]}, max_len=length)
            for b in range(input_ids.shape[0])]
    batch = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
    ids, target, mask = head.preprocess(batch["input_ids"], batch["target"], batch["loss_mask"])
    logits: list[torch.Tensor] = []
    compute = draft.compute_logits

    def recorded(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        logits.append(out)
        return out

    model = OnlineEagle3Model(draft, length=steps, attention_backend="sdpa")
    draft.compute_logits = recorded
    try:
        with cpu_loss():
            out = model(input_ids=ids, attention_mask=batch["attention_mask"], target=head(target),
                        loss_mask=mask, hidden_states=batch["hidden_state"])
    finally:
        del draft.compute_logits
    _, _, acces, corrects, denoms, _, _ = out
    return TTTRun(logits=logits, acc=[float(a) for a in acces], correct=[int(c) for c in corrects],
                  denom=[int(round(float(d))) for d in denoms])
