"""Adapters that misbehave the ways a vendor's adapter can, loaded by dotted path
(`--engine misbehaving_adapters:<Class>`) in tests/test_bad_input_engines.py. Each is the
reference engine with one protocol method broken; the suite must end each run with the
right exit code and a finding, never a hang, a traceback or a stale report."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence

import torch

from harness.engines.base import Capture
from harness.engines.reference import ReferenceEngine


class WrongWidth(ReferenceEngine):
    """Hands the draft one aux slot too many (the slots concatenated twice)."""

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        c = super().capture(prompts)
        return Capture([torch.cat([f, f], dim=-1) for f in c.features], c.fc_out)


class WrongDtype(ReferenceEngine):
    """Hands over integer features (values truncated by a dtype cast)."""

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        c = super().capture(prompts)
        return Capture([f.to(torch.int32) for f in c.features], c.fc_out)


class CrashMidRun(ReferenceEngine):
    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class CrashAtStart(ReferenceEngine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("failed to allocate the KV cache")


class StartupHangs(ReferenceEngine):
    def __init__(self, *args: object, **kwargs: object) -> None:
        threading.Event().wait()  # never set: start-up never finishes


class InterruptedMidCheck(ReferenceEngine):
    """The user presses Ctrl-C while the engine is busy."""

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        os.kill(os.getpid(), signal.SIGINT)
        threading.Event().wait(30)
        return super().capture(prompts)


class InterruptedMidTorchOp(ReferenceEngine):
    """Ctrl-C while the engine thread is inside torch: the interpreter must not shut down under
    that thread (an abort, exit 134) — the CLI exits 130 without interpreter shutdown."""

    def capture(self, prompts: Sequence[Sequence[int]]) -> Capture:
        os.kill(os.getpid(), signal.SIGINT)
        a = torch.randn(256, 256)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
        return super().capture(prompts)
