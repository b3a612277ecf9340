"""A worker that dies mid-call is reported with how it died and the last line of its log, not
as a bare "closed the pipe": on an Intel Xeon the vLLM worker was killed by SIGILL and the
message said nothing of it (2026-12-03). And the vLLM worker asks for AMX before vLLM runs,
which is what stopped that SIGILL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from harness.engines._worker import WorkerError

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("signum", [signal.SIGILL, signal.SIGKILL])
def test_a_worker_killed_by_a_signal_says_which(signum: int, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    from dying_worker import Handle

    handle = Handle({"log_path": str(tmp_path / "worker.log"), "env": {}})
    with pytest.raises(WorkerError) as err:
        handle.call("die", int(signum))
    assert f"dying worker died (killed by signal {int(signum)})" in str(err.value), str(err.value)
    assert str(err.value).endswith(f"its log ends: about to die of signal {int(signum)}"), str(err.value)
    assert not handle.alive


def test_the_vllm_worker_asks_for_amx_where_the_cpu_has_it() -> None:
    from harness.engines._vllm_worker import _request_amx

    if not torch.cpu._is_amx_tile_supported():
        assert _request_amx() is False
        pytest.skip("this CPU has no AMX tiles: nothing to ask for (checked that none is asked)")
    assert _request_amx() is True
