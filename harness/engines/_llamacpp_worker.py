"""One llama.cpp engine in a process of its own, driven over a pipe by `harness.engines.llamacpp`
(the process machinery is `harness.engines._worker`, shared with vLLM and SGLang).

Why a process: llama.cpp reports a broken precondition with GGML_ASSERT / GGML_ABORT, which
abort the process. Extraction of a layer input the target's graph does not provide (every
deepseek2 target) is one: in the test process it would end the pytest session; here it ends
this worker, whose death the parent reads as an EngineCrash quoting the assertion (the last
line of this worker's log: `GGML_NO_BACKTRACE` keeps ggml from appending a gdb backtrace).

Two ops, each through llama.cpp itself:
- `capture`: the target's states as llama.cpp's EAGLE-3 path extracts them for the draft's
  ids, through libllama's own extraction calls (`_llamacpp_lib`);
- `generate`: greedy decoding by llama-server, speculative with `--spec-type draft-eagle3`
  where a draft is loaded, acceptance from the server's own counters (its /metrics
  `llamacpp:spec_decode_*`, read around each request).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from harness.engines import _worker
from harness.engines._llamacpp_lib import cpu_threads

__all__ = ["WorkerHandle", "serve"]

SERVER_START_S = 300.0
REQUEST_S = 600.0
# the draft-eagle3 counters of llama-server's /metrics (tools/server/server-task.cpp), in
# vLLM's vocabulary already
_COUNTERS = {"llamacpp:spec_decode_num_drafts_total": "num_drafts",
             "llamacpp:spec_decode_num_draft_tokens_total": "num_draft_tokens",
             "llamacpp:spec_decode_num_accepted_tokens_total": "num_accepted_tokens"}
_PREDICTED = "tokens_predicted"


def _die_with_parent() -> None:
    """In the server's child before exec: SIGTERM when this worker dies. The worker leaves
    through os._exit (or llama.cpp's abort), never through a clean-up that could stop it."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


class _Server:
    """The loaded target (and draft) in libllama, plus a llama-server started on the first
    `generate`. Methods named like the ops are what the parent may call."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from harness.engines._llamacpp_lib import LlamaLib

        self.spec = spec
        self.lib = LlamaLib(Path(spec["libllama"]))
        started = time.perf_counter()
        self.target = self.lib.load_model(Path(spec["target_gguf"]), spec["overrides"])
        self.n_layer = int(self.lib._lib.llama_model_n_layer(self.target))
        self.layer_ids: list[int] | None = None
        if spec["draft_gguf"]:
            draft = self.lib.load_model(Path(spec["draft_gguf"]))
            self.layer_ids = self.lib.target_layer_ids(draft)
            self.lib._lib.llama_model_free(draft)
        self.server: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.info: dict[str, Any] = {
            "load_s": time.perf_counter() - started, "target_n_layer": self.n_layer,
            "draft_target_layers": self.layer_ids, "kv_overrides": spec["overrides"],
            "gguf_type": spec["outtype"]}

    # -- capture -------------------------------------------------------------------------

    def capture(self, prompts: Sequence[Sequence[int]], out_path: str) -> dict[str, Any]:
        """Per prompt the concatenated states llama.cpp hands the draft's encoder (fc): the
        same refusal as llama.cpp's EAGLE-3 path for a draft whose id count is not 3."""
        import torch
        from safetensors.torch import save_file

        ids = self.layer_ids or []
        if len(ids) != 3:  # common/speculative.cpp, common_speculative_impl_draft_eagle3
            raise RuntimeError(f"draft model is not eagle3 (expected 3 extract layers, got {len(ids)})")
        rows = self.lib.capture(self.target, ids, [list(p) for p in prompts], self.spec["n_ctx"],
                                self.spec["outtype"], self.spec["flash_attn"])
        save_file({f"features.{i}": torch.from_numpy(r) for i, r in enumerate(rows)}, out_path)
        return {"path": out_path, "count": len(rows)}

    # -- generate ------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict[str, Any]:
        """Greedy, one request per prompt, exactly `max_new_tokens` each (ignore_eos),
        acceptance as deltas of the server's counters around each request."""
        self._start_server()
        tokens, per_prompt = [], []
        for prompt in prompts:
            before = self._counters()
            reply = self._post("/completion", {
                "prompt": list(prompt), "n_predict": max_new_tokens, "temperature": 0.0,
                "top_k": 1, "samplers": ["top_k"], "ignore_eos": True, "cache_prompt": False,
                "return_tokens": True, "seed": self.spec["seed"]})
            tokens.append([int(t) for t in reply.get("tokens", [])])
            if self.spec["draft_gguf"]:
                per_prompt.append(self._delta(before))
        result: dict[str, Any] = {"tokens": tokens}
        if self.spec["draft_gguf"]:
            result["per_prompt"] = per_prompt
        return result

    def _delta(self, before: dict[str, int]) -> dict[str, int]:
        """The counters' change since `before`. The server adds a request's counts when it
        releases the slot (metrics_on_prediction, with its predicted tokens), which may trail
        the reply by a moment: wait until the predicted-token count has moved."""
        deadline = time.monotonic() + 10.0
        while True:
            after = self._counters()
            if after.get(_PREDICTED, 0) > before.get(_PREDICTED, 0) or time.monotonic() > deadline:
                return {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS.values()}
            time.sleep(0.05)

    def _counters(self) -> dict[str, int]:
        text = self._get("/metrics")
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in _COUNTERS:
                out[_COUNTERS[name]] = int(float(value))
            elif name == "llamacpp:tokens_predicted_total":
                out[_PREDICTED] = int(float(value))
        return out

    def _start_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            return
        if self.server is not None:
            raise RuntimeError(f"llama-server exited ({self.server.returncode}): {self._server_tail()}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        spec = self.spec
        cmd = [spec["llama_server"], "-m", spec["target_gguf"], "--host", "127.0.0.1",
               "--port", str(self.port), "-c", str(spec["n_ctx"]), "-np", "1", "-t", str(cpu_threads()),
               "--metrics", "--no-webui", "-ngl", "0",
               # the KV cache in the served dtype (llama.cpp's default is f16 whatever the weights)
               "-ctk", spec["outtype"], "-ctv", spec["outtype"]]
        if spec["flash_attn"] is not None:
            cmd += ["-fa", "on" if spec["flash_attn"] else "off"]
        for key, value in spec["overrides"].items():
            cmd += ["--override-kv", f"{key}=int:{value}"]
        if spec["draft_gguf"]:
            k = spec["num_draft_tokens"]
            cmd += ["-md", spec["draft_gguf"], "--spec-type", "draft-eagle3",
                    "--spec-draft-n-max", str(k), "--spec-draft-n-min", str(k), "-ngld", "0",
                    "-ctkd", spec["outtype"], "-ctvd", spec["outtype"]]
        self.server_log = Path(spec["log_path"]).with_suffix(".server.log")
        self.info["llama_server_cmd"] = cmd
        with open(self.server_log, "ab") as log:
            self.server = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                           env={**os.environ, "GGML_NO_BACKTRACE": "1"},
                                           preexec_fn=_die_with_parent)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.server.returncode}) at start-up: "
                                   f"{self._server_tail()}")
            try:
                if json.loads(self._get("/health", timeout=2.0)).get("status") == "ok":
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server did not become healthy in {SERVER_START_S:.0f}s")

    def _server_tail(self) -> str:
        """The server's last meaningful log line: its assertion where it aborted."""
        try:
            lines = [ln for ln in self.server_log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        marked = [ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln or "error" in ln.lower()]
        return (marked or lines or [""])[-1].strip()

    def _get(self, path: str, timeout: float = REQUEST_S) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
            return r.read().decode()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as r:
                return json.loads(r.read().decode())
        except (urllib.error.URLError, OSError, ConnectionError) as exc:
            time.sleep(0.5)  # let a dying server finish writing its log
            dead = self.server is not None and self.server.poll() is not None
            raise RuntimeError(f"llama-server {'died' if dead else 'failed'} serving the request: "
                               f"{self._server_tail() or exc}") from None

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()


def serve(conn: Connection) -> None:
    _worker.serve(conn, _Server)


class WorkerHandle(_worker.WorkerHandle):
    """A started llama.cpp worker."""

    module: ClassVar[str] = "harness.engines._llamacpp_worker"
    label: ClassVar[str] = "llama.cpp"
    forced_env: ClassVar[dict[str, str]] = {"GGML_NO_BACKTRACE": "1"}


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
