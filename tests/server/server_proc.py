"""A real ``speculant serve`` subprocess on a free loopback port, for the server tests.

``ServerProcess(args, log_dir).start()`` launches it (or a launcher script
that registers test plugins first), waits for ``/health`` to answer 200 and
fails with the server's log if it exits instead. ``stop()`` sends SIGTERM and
returns the exit status. With ``api_key`` the helpers (``client``, ``metrics``)
send it; ``env`` adds variables to the server's environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI = ["-c", "import sys; from speculant.cli import main; sys.exit(main())"]
CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")
STARTUP_LIMIT_S = 180  # loading on a busy 2-core machine; the wait ends as soon as /health answers 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], log_dir: Path, launcher: Path | None = None, *, api_key: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra_env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        head = [str(launcher)] if launcher else CLI
        self.cmd = [sys.executable, *head, "serve", "--port", str(self.port), "--log-level", "warning",
                    "--threads", "1", *args]
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        # the checkout under test first, also for a launcher script (whose own directory leads sys.path)
        path = os.pathsep.join([str(REPO_ROOT / "tests" / "server"), str(REPO_ROOT)])
        env = {**os.environ, "PYTHONPATH": path, **self.extra_env}
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {STARTUP_LIMIT_S} s:\n{self.read_log()}")

    def rss_bytes(self) -> int:
        """The server process's resident memory (Linux: /proc)."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no VmRSS in /proc/{self.proc.pid}/status")

    def read_log(self) -> str:
        return self.log_path.read_text()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, timeout=120)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0,
                                  timeout=300)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}."""
        out = {}
        for line in httpx.get(self.url + "/metrics", headers=self.headers, timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, limit_s: float = 60) -> dict[str, float]:
        """Metrics once no request is running or waiting (aborts land between steps)."""
        deadline = time.monotonic() + limit_s
        while True:
            m = self.metrics()
            idle = m["speculant_requests_running"] == 0 and m["speculant_requests_waiting"] == 0
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, limit_s: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(limit_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def sse_events(response: httpx.Response) -> list[dict | str]:
    """The ``data:`` payloads of a streamed response (``"[DONE]"`` as a str)."""
    import json

    out: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def engine_config(model_dir: Path, *, proposer: str | None = "ngram", scorer: str = "mqa", num_blocks: int = 64,
                  max_num_seqs: int = 16, draft_dir: Path | None = None) -> dict:
    """The servers' config: a KV pool of ``num_blocks`` x 4 tokens (64: 256 slots, one max_model_len;
    small enough that 16 running requests preempt each other)."""
    data: dict = {
        "model": {"path": str(model_dir), "dtype": "float32"},
        "cache": {"block_size": 4, "num_blocks": num_blocks},
        "scheduler": {"max_num_batched_tokens": 64, "max_num_seqs": max_num_seqs, "enable_chunked_prefill": True},
        "speculative": {},
    }
    if proposer is not None:
        options = {"model": str(draft_dir)} if proposer == "draft_model" else {}
        data["speculative"] = {"proposer": proposer, "proposer_options": options, "scorer": scorer,
                               "acceptance": "rejection", "num_speculative_tokens": 3}
    return data


def write_toml(data: dict, path: Path) -> Path:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return str(v)

    lines = []
    for section, items in data.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in items.items()]
    path.write_text("\n".join(lines) + "\n")
    return path
