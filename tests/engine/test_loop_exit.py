"""A program that ends while an ``EngineLoop`` thread is stepping: at exit the
loop is stopped and its thread joined before the interpreter tears down, the
request in flight gets ``RequestAborted`` and the process exits with 0."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    seen = {}

    def after_speculant_exit_hook():  # registered first, so it runs after the engine loop's own hook
        alive = [t.name for t in threading.enumerate() if t.name == "speculant-engine" and t.is_alive()]
        items = list(seen["stream"].items)
        print("ALIVE", alive)
        print("LAST", type(items[-1]).__name__, items[-1])
        sys.stdout.flush()

    atexit.register(after_speculant_exit_hook)

    from speculant import LLMEngine, SamplingParams
    from speculant.config.models import CacheConfig, EngineConfig, ModelConfig
    from speculant.engine.loop import EngineLoop

    engine = LLMEngine(EngineConfig(model=ModelConfig(path=sys.argv[1]), cache=CacheConfig(block_size=4)))
    loop = EngineLoop(engine, feed=lambda: time.sleep(0.02))  # slow steps: still stepping at exit
    loop.start()
    stream = loop.stream([5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    seen["stream"] = stream
    stream.next(timeout=60)
    print("STARTED")
""")


def test_exit_while_stepping_stops_the_loop_first(llama_dir):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(llama_dir)], capture_output=True, text=True,
                          timeout=120, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "STARTED" in lines
    assert "ALIVE []" in lines, done.stdout
    assert any(line.startswith("LAST RequestAborted") and "the program exited before it finished" in line
               for line in lines), done.stdout
