"""Per-step costs of an `Eagle3Runtime`, measured operation by operation on its device.

The cost model (`harness.core.throughput`) needs what one plain decode step, one verify forward of
k + 1 tokens, one draft step and one draft feed cost on the engine's own kernels. Each is
timed in isolation against a real cached prefix (the prompt prefilled into the target's and
the draft's caches), the cache cropped back after every repeat so each repeat sees the same
prefix, and the device synchronised around every timing (CUDA kernels run asynchronously: an
unsynchronised timer measures the launch, not the work). The minimum over repeats is kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from harness.core.throughput import StepCosts
from harness.engines.speculative import Eagle3Runtime
from harness.models.draft import DraftKV


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A no-argument function that waits for the device's queued work."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _min_times(ops: dict[str, Callable[[], object]], repeats: int,
               sync: Callable[[], None]) -> dict[str, float]:
    """Minimum seconds per operation, the operations interleaved repeat by repeat so that a
    burst of load from other work hits all of them alike instead of one."""
    for fn in ops.values():
        fn()  # warm-up: first-call allocations and kernel selection are not a step's cost
    best = dict.fromkeys(ops, math.inf)
    for _ in range(repeats):
        for name, fn in ops.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


@torch.inference_mode()
def measure_step_costs(runtime: Eagle3Runtime, prompt: Sequence[int], num_draft_tokens: int,
                       acceptance_length: float, repeats: int = 10) -> StepCosts:
    """Time the four operations of the cost model on `runtime` at prefix `prompt`."""
    if not prompt:
        raise ValueError("measure_step_costs needs a non-empty prompt (the cached prefix)")
    k = int(num_draft_tokens)
    dev = runtime.device
    sync = synchronizer(dev)
    seq = [int(t) for t in prompt]
    p = len(seq)
    cache = DynamicCache(config=runtime.target.config)
    logits, aux = runtime.target_forward(torch.tensor([seq], device=dev),
                                         torch.arange(p, device=dev)[None], cache)
    bonus = int(logits[0, -1].argmax())
    one = torch.tensor([[bonus]], device=dev)
    block = torch.tensor([[bonus] * (k + 1)], device=dev)

    def plain() -> None:
        runtime.target_forward(one, torch.tensor([[p]], device=dev), cache, record=False)
        cache.crop(-1)

    def verify() -> None:  # recording: an engine captures aux states on every verify
        runtime.target_forward(block, torch.arange(p, p + k + 1, device=dev)[None], cache)
        cache.crop(-(k + 1))

    draft = runtime.draft
    kv = DraftKV()
    hidden = runtime.project(aux.to(draft.fc.weight.dtype))
    out = draft.step(torch.tensor([seq[1:] + [bonus]], device=dev), hidden,
                     torch.arange(p, device=dev)[None], kv)
    last = out[:, -1:]
    fed = max(1, math.ceil(acceptance_length))
    feed_ids = torch.tensor([[bonus] * fed], device=dev)
    feed_aux = aux[:, -1:].expand(1, fed, -1).to(draft.fc.weight.dtype)

    def draft_step() -> None:
        draft.logits(last[:, -1])
        draft.step(one, last, torch.tensor([[p]], device=dev), kv)
        kv.truncate(p)

    def feed() -> None:  # fc on the target's features, then the draft over those positions
        draft.step(feed_ids, runtime.project(feed_aux), torch.arange(p, p + fed, device=dev)[None], kv)
        kv.truncate(p)

    t = _min_times({"plain": plain, "verify": verify, "draft_step": draft_step, "feed": feed},
                   repeats, sync)
    return StepCosts(plain_step=t["plain"], verify=t["verify"], draft_step=t["draft_step"],
                     draft_feed=t["feed"], num_draft_tokens=k, prefix_tokens=p, device=str(dev))
