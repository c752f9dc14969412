"""Serving latency of ``speculant serve``: request rate vs time to first token
and inter-token latency, with and without speculation.

Three servers on free loopback ports, all started first and warmed up:
``speculant serve`` with ``examples/smollm2.toml`` (SmolLM2-135M-Instruct,
n-gram speculation), the same without speculation, and ``transformers serve``
on the same converted float32 weights (``--no-transformers`` skips it). Each
rate is run on one server after the other (so all see about the same
background load): streaming chat requests (the code-editing prompts of
``examples/prompts``, whose replies copy their prompt, greedy, ``max_tokens``
tokens, EOS ignored where the server allows it) with seeded Poisson arrivals.
Per request, from the client's side:

* TTFT: request sent -> first event carrying text;
* TPOT: (last event - first event) / (tokens - 1), the mean time per output token;
* ITL: the gaps between consecutive events (an event carries all the tokens of
  one engine step, several when speculation accepted a run).

p50/p99 are over all requests (TTFT, TPOT) or all gaps (ITL) of a rate.
Results: ``benchmarks/results/serve_bench.json`` and ``serve_bench.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

import harness
from harness import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "server"))
from server_proc import ServerProcess, free_port

from speculant.config.models import read_config_file


def prompts() -> list[str]:
    d = REPO_ROOT / "examples" / "prompts"
    lines = (d / "edit_tasks.txt").read_text().splitlines() + [(d / "add_type_hints.txt").read_text()]
    return [p.replace("\\n", "\n") for p in lines if p.strip()]


def configs(model_path: str, out_dir: Path) -> dict[str, Path]:
    data = read_config_file(REPO_ROOT / "examples" / "smollm2.toml")
    data["model"]["path"] = model_path
    plain = {k: v for k, v in data.items() if k != "speculative"}
    out = {}
    for name, d in (("ngram", data), ("no_spec", plain)):
        out[name] = out_dir / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(d))
    return out


async def one_request(client: httpx.AsyncClient, server: Served, prompt: str, max_tokens: int) -> dict:
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    if server.speculant:  # transformers serve refuses fields it does not know, and sends usage anyway
        body.update(ignore_eos=True, stream_options={"include_usage": True})
    url = server.url
    start = time.perf_counter()
    times: list[float] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter() - start)
    return {"ttft": times[0], "tpot": (times[-1] - times[0]) / max(tokens - 1, 1),
            "itl": [b - a for a, b in zip(times, times[1:])], "tokens": tokens, "events": len(times)}


async def run_rate(server: Served, rate: float, num_requests: int, max_tokens: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    texts = prompts()
    limits = httpx.Limits(max_connections=num_requests + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        tasks = []
        for i in range(num_requests):
            tasks.append(asyncio.create_task(one_request(client, server, texts[i % len(texts)], max_tokens)))
            await asyncio.sleep(rng.expovariate(rate))
        return await asyncio.gather(*tasks)


def summarize(results: list[dict], wall_s: float) -> dict:
    ttft, tpot = [r["ttft"] for r in results], [r["tpot"] for r in results]
    itl = [g for r in results for g in r["itl"]]
    tokens = sum(r["tokens"] for r in results)
    pct = harness.percentile
    return {"ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
            "tpot_p50_ms": 1e3 * pct(tpot, 50), "tpot_p99_ms": 1e3 * pct(tpot, 99),
            "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p99_ms": 1e3 * pct(itl, 99),
            "tokens_per_event": tokens / sum(r["events"] for r in results),
            "output_tokens_per_s": tokens / wall_s, "num_requests": len(results), "wall_s": wall_s}


@dataclass
class Served:
    """A server under test: speculant serve (a ServerProcess) or transformers serve."""

    name: str
    url: str
    model: str
    speculant: bool
    process: ServerProcess | subprocess.Popen

    def stop(self) -> int:
        if isinstance(self.process, ServerProcess):
            return self.process.stop()
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)
        return 0  # transformers serve's own exit status after Ctrl-C is not what is measured here


def start_speculant(name: str, config: Path, log_dir: Path, threads: int) -> Served:
    server = ServerProcess(["--config", str(config), "--served-model-name", "smollm2"], log_dir)
    server.cmd = [c for c in server.cmd if c not in ("--threads", "1")] + ["--threads", str(threads)]
    server.start()
    return Served(name, server.url, "smollm2", True, server)


def start_transformers(model_dir: Path, log_dir: Path, threads: int) -> Served:
    """``transformers serve DIR`` on the same float32 weights (speculant's converted GGUF),
    torch limited to ``threads`` through OMP_NUM_THREADS (it has no threads option)."""
    port = free_port()
    log = open(log_dir / "transformers-serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir),
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return Served("transformers_serve", url, str(model_dir), False, proc)
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"transformers serve did not start: {(log_dir / 'transformers-serve.log').read_text()}")


def converted_dir(config: Path) -> Path:
    """The HF directory speculant converted the GGUF file into (loads from its cache)."""
    from speculant.config.compat import build_config
    from speculant.model.loading.gguf_source import resolve_model_source

    model = build_config(yaml.safe_load(config.read_text()), str(config)).model
    return Path(resolve_model_source(model.path, model.gguf_file, model.dtype))


def run_servers(configs: dict[str, Path], log_dir: Path, args: argparse.Namespace) -> dict:
    """All servers up at once (an idle one costs no CPU); each rate is run on one
    server after the other, so all see about the same background load."""
    servers = [start_speculant(name, config, log_dir, args.threads) for name, config in configs.items()]
    if args.transformers:
        servers.append(start_transformers(converted_dir(configs["no_spec"]), log_dir, args.threads))
    out: dict[str, dict] = {s.name: {} for s in servers}
    try:
        for server in servers:
            asyncio.run(run_rate(server, 100.0, 2, 16, seed=0))  # warm-up: kernels, oneDNN packing
        for rate in args.rates:
            for server in servers:
                start = time.perf_counter()
                results = asyncio.run(run_rate(server, rate, args.num_requests, args.max_tokens, seed=1))
                out[server.name][str(rate)] = summarize(results, time.perf_counter() - start)
                print(server.name, rate, {k: round(v, 2) for k, v in out[server.name][str(rate)].items()},
                      flush=True)
        for server in servers:
            if server.speculant:
                out[server.name]["server_mean_acceptance_length"] = \
                    server.process.metrics().get("speculant_spec_mean_acceptance_length", 0.0)
    finally:
        codes = {server.name: server.stop() for server in servers}
    assert set(codes.values()) == {0}, codes
    return out


def chart(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for (name, runs), color in zip(data["configs"].items(), ("tab:blue", "tab:orange", "tab:gray")):
        rates = [r for r in runs if r[0].isdigit()]  # skips server_mean_acceptance_length
        for ax, metric in zip(axes, ("ttft", "tpot", "itl")):
            for q, style in (("p50", "-o"), ("p99", "--x")):
                ax.plot([float(r) for r in rates], [runs[r][f"{metric}_{q}_ms"] for r in rates], style, color=color,
                        label=f"{name} {q}")
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(f"{metric.upper()} (ms)")
            ax.set_title(metric.upper())
            ax.grid(alpha=0.3)
    axes[0].set_yscale("log")  # transformers serve answers one request at a time: its TTFT is the queue
    axes[0].legend(fontsize=8)
    env = data["environment"]
    fig.suptitle(f"speculant serve, SmolLM2-135M-Instruct fp32, {data['num_requests']} streaming chat requests "
                 f"x {data['max_tokens']} tokens per rate -- {env['cpu']}, {env['date_utc'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "serve_bench.json", threads=1)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    ap.add_argument("--num-requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--no-transformers", dest="transformers", action="store_false",
                    help="skip the transformers serve baseline")
    args = ap.parse_args()  # --threads: torch threads per server (default 1: steadier on a shared machine)
    bench = harness.start("serve_bench", args)
    with tempfile.TemporaryDirectory() as tmp:
        configs_run = run_servers(configs(harness.smollm2_path(), Path(tmp)), Path(tmp), args)
    data = bench.write({"num_requests": args.num_requests, "max_tokens": args.max_tokens, "rates": args.rates,
                        "configs": configs_run})
    chart(data, args.out.with_suffix(".png"))
    rows = [[name, rate, *(round(runs[str(rate)][k]) for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                                                "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms")),
             round(runs[str(rate)]["tokens_per_event"], 2)]
            for name, runs in data["configs"].items() for rate in args.rates]
    print(harness.markdown_table(["config", "req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p50",
                                 "ITL p99", "tokens/event"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
