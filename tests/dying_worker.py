"""A worker (harness.engines._worker) whose one op kills its own process with a signal: how
an engine dies of SIGILL (vLLM's AMX kernels in a process that never asked for AMX) or of the
OOM killer, for tests/test_worker_death.py. No engine inside: the parent side is what is
tested."""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from harness.engines import _worker


class _Server:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.info: dict[str, Any] = {}

    def die(self, signum: int) -> None:
        sys.stderr.write(f"about to die of signal {signum}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signum)


class Handle(_worker.WorkerHandle):
    module: ClassVar[str] = "dying_worker"
    label: ClassVar[str] = "dying"


if __name__ == "__main__":
    _worker.serve(Connection(int(sys.argv[1])), _Server)
