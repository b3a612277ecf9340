"""Placing the target over several processes, through transformers' own tensor parallelism.

The motivating target (61 layers, DeepSeek-V3 architecture) does not fit one GPU, so the
oracle and the reference engine can run it where it runs in production: over the processes
of a `torchrun` launch (or any initialised `torch.distributed` process group), each process
holding 1/world_size of every tensor-parallel weight. The mechanism is transformers' own:
`from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))` applies the
model class's `base_model_tp_plan` (for DeepSeek-V3 in transformers 5.19: the dense and
shared-expert MLPs column- then row-wise, the routed experts' packed gate/up column-wise and
down row-wise; attention and the router replicated) and shards the weights as DTensors on a
device mesh over the process group. Nothing here shards anything: this module only checks
that the process group is there, names the fix where it is not, and loads.

Why tensor parallelism and not transformers' pipeline plan or `device_map` is in
docs/DESIGN.md ("A target over several processes"). The capture consequence, verified by
tests/test_distributed_placement.py rather than assumed: every row-parallel output is
all-reduced inside the layer, so the residual stream between layers, hence every boundary,
is replicated whole on every rank, and the recorder (harness/models/residual.py) reads the
same full-width tensor the single-process target gives.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path

import torch

# The placements the oracle and the reference engine accept (EngineOptions.placement,
# Oracle(placement=)): None is the whole target in this process.
TENSOR_PARALLEL = "tensor-parallel"
PLACEMENTS: tuple[str, ...] = (TENSOR_PARALLEL,)


class PlacementError(ValueError):
    """A placement that cannot be made here; the message is one line with the fix."""


def world_size() -> int:
    """Processes of the initialised default group (1 where none is initialised)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the default group (0 where none is initialised)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _launched_size() -> int:
    """The world size a launcher (torchrun) announced, where no group is initialised yet."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def check_placement(placement: str | None) -> None:
    """Raise PlacementError, one line with the fix, where `placement` cannot be made here."""
    if placement is None:
        return
    if placement not in PLACEMENTS:
        raise PlacementError(f"unknown placement {placement!r}; use one of "
                             f"{', '.join(PLACEMENTS)}, or none for the whole target in one process")
    if importlib.util.find_spec("accelerate") is None:
        # transformers 5.19 refuses a tp_plan without it (integrations/accelerate.py)
        raise PlacementError("placement 'tensor-parallel' needs the accelerate package, which "
                             "transformers requires for a tp_plan; pip install "
                             "'eagle3-conformance[distributed]'")
    size = world_size() if torch.distributed.is_initialized() else _launched_size()
    if size < 2:
        raise PlacementError("placement 'tensor-parallel' needs several processes: launch under "
                             "torchrun --nproc-per-node N (N >= 2), or initialise a "
                             "torch.distributed process group (gloo on the CPU, nccl on GPUs) first")


def load_target_placed(path: str | Path, dtype: torch.dtype, placement: str) -> torch.nn.Module:
    """The checkpoint at `path` loaded by transformers with its own tensor-parallel plan over
    every process of the default group (transformers initialises the group from torchrun's
    environment where none is initialised: gloo on the CPU, nccl on CUDA)."""
    check_placement(placement)
    from transformers import AutoModelForCausalLM, DistributedConfig

    size = world_size() if torch.distributed.is_initialized() else _launched_size()
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=dtype, distributed_config=DistributedConfig(tp_plan="auto", tp_size=size))
    return model.eval()


@cache
def _dtensor() -> type | None:
    """torch's DTensor class, imported once (the recorder asks on every hook call); None
    where torch was built without distributed support."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded(x: object) -> bool:
    """Whether `x` is a DTensor (a tensor laid out over the mesh, possibly a shard per rank)."""
    cls = _dtensor()
    return cls is not None and isinstance(x, cls)


def gathered(x: torch.Tensor) -> torch.Tensor:
    """`x` as one whole tensor on this rank: a DTensor all-gathered (its own
    `full_tensor()`: the collective, not a copy of one shard); a plain tensor as it is."""
    return x.full_tensor() if is_sharded(x) else x
