"""The one residual-stream recorder (harness.models.residual) is what the golden features are
read through: recomputed at the builder's thread count, they equal the committed tensors bit
for bit, so the recorder means by "boundary b" exactly what the bundle pinned."""

from __future__ import annotations

import pytest
import torch

from harness.golden.bundle import load_bundle
from harness.golden.features import target_features
from harness.golden.oracle import Oracle
from harness.models.residual import StateRecorder
from harness.paths import default_bundle_path


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    return Oracle(load_bundle(default_bundle_path(), verify_hashes=False))


def test_features_reproduce_the_committed_golden_tensors(oracle: Oracle) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the committed bundle is built at one thread (golden build --threads 1)
    try:
        for prompt in oracle.pinned_prompts[::7]:
            fresh, pinned = target_features(oracle.target, prompt), oracle.features(prompt)
            for name in ("boundaries", "final_normed", "mlp_out"):
                assert torch.equal(getattr(fresh, name), getattr(pinned, name)), (prompt, name)
    finally:
        torch.set_num_threads(threads)


def test_the_recorder_is_inert_unless_active_and_removes_its_hooks(oracle: Oracle) -> None:
    target = oracle.target
    recorder = StateRecorder(target)
    target(input_ids=torch.tensor([[5, 6]]), use_cache=False)
    with pytest.raises(RuntimeError, match="did not pass through every decoder layer"):
        recorder.take()
    recorder.close()
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in target.modules())
    assert hooks == 0
