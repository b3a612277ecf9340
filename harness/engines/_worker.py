"""One engine in a process of its own, driven over a pipe: the machinery the vLLM and SGLang
adapters share (each names its own worker module and server class).

Why a process: an engine error can leave an in-process engine unusable, and a draft the
suite is *meant* to break (a dropped aux slot, an id that crashes the target) must not take
the test session with it (SGLang's Engine even signals its parent when a child dies).
Tensors come back through a safetensors file, not the pipe, so a large capture never sits
in a pickle.

The parent side is `WorkerHandle`; the child side is `serve`. A child that hits an error
reports it and exits: the parent starts a fresh one on the next call.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

STARTUP_TIMEOUT_S = 900.0
CALL_TIMEOUT_S = 900.0
# The worker runs `python -m <worker module>`; it must find this checkout.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerError(RuntimeError):
    """The engine failed inside the worker, or the worker died; the message is one line (where
    the worker died, it quotes the last line of the engine's own log)."""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:600]


# --------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------

def serve(conn: Connection, server_factory: Callable[[dict[str, Any]], Any]) -> None:
    """Child entry point: read the spec, start the engine (`server_factory(spec)`, an object
    with an `info` dict whose methods are the ops), answer ops until told to close. Leaves
    through `os._exit`: engines keep threads and child processes that can hold a normal
    interpreter exit for many seconds, and nothing of this process needs saving."""
    spec = conn.recv()
    code = 0
    try:
        server = server_factory(spec)
    except BaseException as exc:
        traceback.print_exc()
        conn.send(("startup_error", one_line(exc)))
        _exit(1)
    conn.send(("ready", server.info))
    while True:
        try:
            op, args = conn.recv()
        except EOFError:
            break
        if op == "close":
            break
        try:
            conn.send(("ok", getattr(server, op)(*args)))
        except BaseException as exc:
            traceback.print_exc()
            conn.send(("error", one_line(exc)))
            code = 1  # the engine's state is unknown now; the parent starts a fresh one
            break
    _exit(code)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --------------------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------------------

class WorkerHandle:
    """A started worker process; `call` forwards one op and waits for its answer.

    A fresh interpreter (`python -m`), not multiprocessing's spawn: spawn re-runs the
    caller's `__main__`, which an unguarded user script cannot survive. Subclasses name the
    worker module, the engine (for messages) and environment the engine must run under."""

    module: ClassVar[str]
    label: ClassVar[str]
    forced_env: ClassVar[dict[str, str]] = {}

    def __init__(self, spec: dict[str, Any]) -> None:
        started = time.monotonic()
        self.spec = spec
        self.log_path = Path(spec["log_path"])
        self._conn, child = multiprocessing.Pipe()
        # the spec's env holds defaults: a variable the user set explicitly wins
        env = {**spec["env"], **os.environ, **self.forced_env,
               "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            # not a daemon: the engine may start helper processes of its own
            self._proc = subprocess.Popen(
                [sys.executable, "-m", self.module, str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env)
        child.close()
        self._conn.send(spec)
        reply = self._receive(STARTUP_TIMEOUT_S)
        if reply[0] != "ready":
            self.stop()
            raise WorkerError(reply[1])
        self.info: dict[str, Any] = reply[1]
        # process start to "ready": interpreter, engine import, model load (what a first call
        # that starts another worker of this engine spends again)
        self.startup_s = time.monotonic() - started

    def call(self, op: str, *args: Any) -> Any:
        try:
            self._conn.send((op, args))
        except (BrokenPipeError, OSError) as exc:
            self.stop()
            raise WorkerError(f"{self.label} worker is gone: {one_line(exc)}") from exc
        reply = self._receive(CALL_TIMEOUT_S)
        if reply[0] == "ok":
            return reply[1]
        self.stop()
        raise WorkerError(reply[1])

    def _receive(self, timeout: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(1.0):
            if self._proc.poll() is not None:
                raise self._died()
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerError(f"{self.label} worker gave no answer in {timeout:.0f}s")
        try:
            return self._conn.recv()
        except EOFError as exc:
            # the pipe's end is often seen before the exit: wait for it, to say how it died
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self.stop()
                raise WorkerError(f"{self.label} worker closed the pipe and did not exit") from exc
            raise self._died() from exc

    def _died(self) -> WorkerError:
        """The error for a worker that exited mid-call: its exit code (a negative one is the
        signal that killed it) and the last line of its log."""
        code = self._proc.returncode
        self.stop()
        tail = self.log_tail()
        last = tail.splitlines()[-1].strip() if tail else ""
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return WorkerError(f"{self.label} worker died ({how}); its log ends: {last}"[:600])

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        """Ask politely, then insist: a wedged engine must not outlive the test session."""
        if self._proc.poll() is None:
            try:
                self._conn.send(("close", ()))
            except (BrokenPipeError, OSError):
                pass
            for signal_step in (None, self._proc.terminate, self._proc.kill):
                if signal_step is not None:
                    signal_step()
                try:
                    self._proc.wait(10)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._conn.close()
