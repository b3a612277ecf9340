"""One vLLM engine in a process of its own, driven over a pipe by `harness.engines.vllm`.

Why a process: an error inside `LLM.generate` can leave vLLM's in-process engine unusable,
and a draft the suite is *meant* to break (a dropped aux slot, an id that crashes the target)
must not take the test session with it. Why in-process *inside* that process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the probe on the drafter's `combine_hidden_states`
has to live in the same interpreter as the model runner. Tensors come back through a
safetensors file, not the pipe, so a large capture never sits in a pickle.

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
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Enough KV cache for the suite's prompts on any device. Without it vLLM on CPU reserves a
# fraction of the NUMA node (and refuses to start when that much is not free), and on a GPU
# two workers (speculative and plain) could not both take vLLM's default 92%.
KV_CACHE_BYTES = 512 << 20
STARTUP_TIMEOUT_S = 900.0
CALL_TIMEOUT_S = 900.0
# The worker runs `python -m harness.engines._vllm_worker`; it must find this checkout.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class WorkerError(RuntimeError):
    """vLLM failed inside the worker, or the worker died; the message is one line (where the
    worker died, it quotes the last line of vLLM's own log)."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:600]


# --------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------

class _Server:
    """The live engine plus a probe on its drafter. Methods named like the ops are what the
    parent may call."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import vllm
        from vllm import LLM

        self.spec = spec
        self.speculative = spec["draft_dir"] is not None
        self.records: list[dict[str, Any]] = []
        self.recording = False
        kwargs: dict[str, Any] = dict(
            model=spec["target_dir"], dtype=spec["dtype"], seed=spec["seed"],
            max_model_len=spec["max_model_len"], max_num_batched_tokens=max(
                spec["max_model_len"], 2048),
            skip_tokenizer_init=True,  # token-id prompts: the folders carry no tokenizer
            enforce_eager=True,  # start-up in seconds; the suite's models are tiny
            enable_prefix_caching=False,  # a cached prefix would shrink the prefill we probe
            disable_log_stats=False,  # acceptance counters come from the stats loggers
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        if self.speculative:
            kwargs["speculative_config"] = {
                "method": "eagle3", "model": spec["draft_dir"],
                "num_speculative_tokens": spec["num_draft_tokens"]}
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        kwargs.update(spec.get("engine_args", {}))
        started = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.info: dict[str, Any] = {
            "vllm_version": vllm.__version__,
            "startup_s": time.perf_counter() - started,
            "env": {k: os.environ.get(k) for k in ("VLLM_MLA_DISABLE", "VLLM_USE_V2_MODEL_RUNNER")},
            "engine_args": spec.get("engine_args", {}),
        }
        self.info.update(self.llm.collective_rpc(self._install)[0])

    def _install(self, worker: Any) -> dict[str, Any]:
        """Runs inside vLLM's worker: wrap the drafter's fc entry point and report what the
        engine decided. An instance attribute, because forward hooks on the target never
        fire (vLLM's compile wrapper calls `forward` directly) and the drafter calls this
        method by name on every proposal."""
        inner = getattr(worker, "worker", worker)
        runner = inner.model_runner
        target = runner.get_model()
        holder = getattr(target, "model", target)
        info: dict[str, Any] = {
            "model_runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "aux_hidden_state_layers": list(getattr(holder, "aux_hidden_state_layers", ()) or ()),
        }
        # V1 runner: `drafter`; V2 runner (the GPU default where Triton is present): `speculator`.
        proposer = getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
        drafter = getattr(proposer, "model", None)
        if drafter is None or not hasattr(drafter, "combine_hidden_states"):
            return info
        info["drafter"] = type(drafter).__name__
        original = drafter.combine_hidden_states

        def combine_hidden_states(hidden: Any) -> Any:
            if not self.recording:
                return original(hidden)
            record = {"in": hidden.detach().float().cpu().clone(), "out": None}
            self.records.append(record)
            out = original(hidden)
            record["out"] = out.detach().float().cpu().clone()
            return out

        drafter.combine_hidden_states = combine_hidden_states
        return info

    def capture(self, prompts: Sequence[Sequence[int]], out_path: str) -> dict[str, Any]:
        """One prompt per step so the drafter's first call is exactly that prompt's prefill
        (no batch to split back, no scheduler order to trust); one new token is enough for
        the drafter to run once. If vLLM fails, what the probe saw so far is still written:
        a crash in fc on a too-narrow input is itself the evidence."""
        from safetensors.torch import save_file
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=1, detokenize=False)
        tensors: dict[str, Any] = {}
        for i, prompt in enumerate(prompts):
            self.records.clear()
            self.recording = True
            try:
                self.llm.generate([{"prompt_token_ids": list(prompt)}], params, use_tqdm=False)
            except BaseException:
                if self.records:  # the probe saw the features before the drafter failed on them
                    tensors[f"features.{i}"] = self.records[0]["in"]
                save_file(tensors, out_path)
                raise
            finally:
                self.recording = False
            if not self.records:
                raise RuntimeError("vLLM never called the drafter's combine_hidden_states "
                                   "during prefill: no EAGLE-3 fc input to capture")
            first = self.records[0]
            if first["in"].shape[0] != len(prompt):
                raise RuntimeError(f"drafter's first call had {first['in'].shape[0]} rows for "
                                   f"a {len(prompt)}-token prompt (prefill was split)")
            tensors[f"features.{i}"] = first["in"]
            tensors[f"fc_out.{i}"] = first["out"]
        save_file(tensors, out_path)
        return {"path": out_path, "count": len(prompts)}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
        """Greedy, exactly `max_new_tokens` each (ignore_eos: the reference stops on length
        only), acceptance as counter deltas around the call."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True,
                                detokenize=False)
        before = self._counters()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 use_tqdm=False)
        after = self._counters()
        result: dict[str, Any] = {"tokens": [list(o.outputs[0].token_ids) for o in outs]}
        if self.speculative:
            result["acceptance"] = {k: _minus(after.get(k, 0), before.get(k, 0))
                                    for k in set(after) | set(before)}
            result["per_prompt"] = [_request_metrics(o.outputs[0]) for o in outs]
        return result

    def _counters(self) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for metric in self.llm.get_metrics():
            if not metric.name.startswith("vllm:spec_decode_"):
                continue
            key = metric.name.removeprefix("vllm:spec_decode_")
            values = getattr(metric, "values", None)
            if values is not None:
                old = totals.get(key, [])
                width = max(len(old), len(values))
                totals[key] = [(old[i] if i < len(old) else 0) + (values[i] if i < len(values) else 0)
                               for i in range(width)]
            else:
                totals[key] = totals.get(key, 0) + int(getattr(metric, "value", 0))
        return totals


def _minus(a: Any, b: Any) -> Any:
    if isinstance(a, list) or isinstance(b, list):
        a, b = list(a or []), list(b or [])
        width = max(len(a), len(b))
        return [int((a[i] if i < len(a) else 0) - (b[i] if i < len(b) else 0)) for i in range(width)]
    return int(a - b)


def _request_metrics(completion: Any) -> dict[str, Any] | None:
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return None
    return {"histogram": list(metrics.histogram), "num_draft_tokens": int(metrics.num_draft_tokens),
            "per_step_accepted": list(metrics.per_step_accepted)}


def serve(conn: Connection) -> None:
    """Child entry point: read the spec, start the engine, answer ops until told to close.
    Leaves through `os._exit`: vLLM's in-process engine keeps threads that can hold a
    normal interpreter exit for many seconds, and nothing of this process needs saving."""
    spec = conn.recv()
    code = 0
    try:
        server = _Server(spec)
    except BaseException as exc:
        traceback.print_exc()
        conn.send(("startup_error", _one_line(exc)))
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
            conn.send(("error", _one_line(exc)))
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
    caller's `__main__`, which an unguarded user script cannot survive."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.log_path = Path(spec["log_path"])
        self._conn, child = multiprocessing.Pipe()
        # the spec's env holds defaults: a variable the user set explicitly wins
        env = {**spec["env"], **os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            # not a daemon: vLLM may start helper processes of its own
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "harness.engines._vllm_worker", str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env)
        child.close()
        self._conn.send(spec)
        reply = self._receive(STARTUP_TIMEOUT_S)
        if reply[0] != "ready":
            self.stop()
            raise WorkerError(reply[1])
        self.info: dict[str, Any] = reply[1]

    def call(self, op: str, *args: Any) -> Any:
        try:
            self._conn.send((op, args))
        except (BrokenPipeError, OSError) as exc:
            self.stop()
            raise WorkerError(f"vLLM worker is gone: {_one_line(exc)}") from exc
        reply = self._receive(CALL_TIMEOUT_S)
        if reply[0] == "ok":
            return reply[1]
        self.stop()
        raise WorkerError(reply[1])

    def _receive(self, timeout: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(1.0):
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                tail = self.log_tail()
                last = tail.splitlines()[-1].strip() if tail else ""
                raise WorkerError(f"vLLM worker died (exit code {code}); its log ends: {last}"[:600])
            if time.monotonic() > deadline:
                self.stop()
                raise WorkerError(f"vLLM worker gave no answer in {timeout:.0f}s")
        try:
            return self._conn.recv()
        except EOFError as exc:
            self.stop()
            raise WorkerError("vLLM worker closed the pipe") from exc

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


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
