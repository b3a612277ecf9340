"""What the oracle and the reference engine answer on the committed bundle, in one process or
in each process of a tensor-parallel placement: the record two such runs are compared by.

Run under torchrun, every rank writes its own record (`--out DIR/rank<R>.pt`); run plainly,
the single-process record. tests/test_distributed_placement.py launches both and compares
them; benchmarks/placement_step_costs.py reuses `build`. The record holds, per prompt: every
boundary, layer output without its residual and the final norm's output as the recorder saw
them (with the types and widths of the raw tensors the hooks were handed, so "the residual
stream is whole on every rank" is observed, not assumed), the fp32 logits, the reference
engine's captured features and fc output for one draft, and its greedy and speculative
tokens.

    torchrun --nproc-per-node 2 -m harness.tools.placement_probe --out /tmp/probe
    python -m harness.tools.placement_probe --out /tmp/probe --single
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import Bundle, load_bundle
from harness.golden.features import target_features
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.models.placement import TENSOR_PARALLEL, gathered, is_sharded, rank, world_size
from harness.models.target import decoder_layers

DRAFT = "specforge-default"
NEW_TOKENS = 12


def probe_prompts(bundle: Bundle, count: int = 3) -> list[list[int]]:
    """The longest pinned prompts (most positions per forward), plus one the bundle does not
    pin, so the on-the-fly path of the oracle is exercised too."""
    pinned = sorted(bundle.prompts(), key=len)[-count:]
    return [*pinned, [5, 17, 42, 99, 3, 7, 250, 11, 64]]


def build(bundle: Bundle, placement: str | None, draft: str = DRAFT) -> tuple[Oracle, ReferenceEngine]:
    spec = bundle.draft(draft)
    oracle = Oracle(bundle, placement=placement)
    engine = ReferenceEngine(bundle.target_dir, bundle.draft_dir(draft), EngineOptions(
        num_draft_tokens=spec.num_draft_tokens, training_convention=spec.convention,
        placement=placement))
    return oracle, engine


def _raw_states(model: torch.nn.Module, prompt: Sequence[int]) -> list[dict[str, Any]]:
    """Per decoder layer and the final norm: the type and shape of the tensor its forward
    pre-hook is handed (the boundary as the runtime holds it, before any gathering)."""
    seen: list[dict[str, Any]] = []

    def hook(_module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        seen.append({"type": type(x).__name__, "sharded": is_sharded(x), "shape": list(x.shape)})

    modules = [*decoder_layers(model), model.model.norm]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([list(prompt)]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def _sharded_state(boundaries: torch.Tensor) -> dict[str, Any] | None:
    """Where a plan would leave the stream sharded by columns (none of DeepSeek-V3's does): a
    boundary laid out as Shard(-1) over the mesh, as the recorder's `gathered` returns it. The
    local width is the shard's; the gathered one must be the whole state, equal to it."""
    if world_size() < 2:
        return None
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    whole = boundaries[-1][None].contiguous()
    placed = distribute_tensor(whole, init_device_mesh("cpu", (world_size(),)), [Shard(-1)])
    back = gathered(placed)
    return {"local_width": int(placed.to_local().shape[-1]), "gathered_width": int(back.shape[-1]),
            "equal": bool(torch.equal(back, whole))}


def record(bundle: Bundle, placement: str | None) -> dict[str, Any]:
    oracle, engine = build(bundle, placement)
    prompts = probe_prompts(bundle)
    try:
        feats = [target_features(oracle.target, p) for p in prompts]
        capture = engine.capture(prompts)
        greedy = engine.generate(prompts, NEW_TOKENS, speculative=False)
        spec = engine.generate(prompts, NEW_TOKENS, speculative=True)
    finally:
        engine.close()
    return {
        "world_size": world_size(), "rank": rank(), "placement": placement, "prompts": prompts,
        "raw": _raw_states(oracle.target, prompts[0]), "sharded_state": _sharded_state(feats[0].boundaries),
        "boundaries": [f.boundaries for f in feats], "mlp_out": [f.mlp_out for f in feats],
        "final_normed": [f.final_normed for f in feats], "logits": [f.logits for f in feats],
        "features": capture.features, "fc_out": capture.fc_out,
        "greedy": greedy.tokens, "speculative": spec.tokens,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for rank<R>.pt / single.pt")
    parser.add_argument("--single", action="store_true", help="the whole target in this process")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    bundle = load_bundle(default_bundle_path(), verify_hashes=False)
    rec = record(bundle, None if args.single else TENSOR_PARALLEL)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(rec, args.out / ("single.pt" if args.single else f"rank{rec['rank']}.pt"))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
