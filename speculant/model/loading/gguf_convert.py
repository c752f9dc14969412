"""Convert one GGUF checkpoint into a Hugging Face model directory.

transformers' GGUF support reads the file (``from_pretrained(dir,
gguf_file=...)``; it needs the ``gguf`` and ``accelerate`` packages, the
``speculant[gguf]`` extra) and dequantizes every tensor into the asked dtype;
the model (safetensors, config, generation config) and the tokenizer (with
its chat template) are then saved with ``save_pretrained``. Whatever goes
wrong is reported naming the file: a missing package names the extra, a file
that is not GGUF or cannot be read is called truncated or corrupt, and an
architecture, tokenizer or quantization type transformers cannot convert is
an ``UnsupportedModelError`` with the architecture and tensor types. Caching
the result is ``gguf_source``'s job.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import struct
from pathlib import Path

from speculant.model.loading.files import ModelFileError, UnsupportedModelError

MAGIC = b"GGUF"
INSTALL = "pip install 'speculant[gguf]'"
NEEDED = (("gguf", (0, 10)), ("accelerate", (1, 1)))  # transformers loads GGUF files only with both


def require_gguf_support(source: Path, option: str) -> None:
    """Raise ImportError naming the extra when a package GGUF loading needs is missing or too old."""
    for name, minimum in NEEDED:
        try:
            importlib.import_module(name)
            version = importlib.metadata.version(name)
        except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
            raise ImportError(f"{option} = {str(source)!r} is a GGUF checkpoint; loading it needs the {name!r} "
                              f"package, which is not installed ({exc}); install it with {INSTALL}") from exc
        if _version_tuple(version) < minimum:
            raise ImportError(f"{option} = {str(source)!r} is a GGUF checkpoint; loading it needs {name} >= "
                              f"{'.'.join(map(str, minimum))}, but {version} is installed; upgrade with {INSTALL}")


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_magic(source: Path, option: str) -> None:
    with open(source, "rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC:
        raise ModelFileError(f"{option}: {str(source)!r} is not a GGUF file: it starts with {head!r}, not the "
                             f"GGUF magic {MAGIC!r} (a truncated, corrupt or other kind of file); point {option} "
                             "at a .gguf checkpoint or a Hugging Face model directory")


def converter_version() -> str:
    import transformers

    return transformers.__version__


def convert(source: Path, out: Path, dtype: str, option: str) -> None:
    """Dequantize ``source`` with transformers and save it as a model directory in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    try:
        from transformers import GgufConfig  # newer transformers may keep weights packed unless told not to

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    try:
        model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=dtype,
                                                     **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    except (ValueError, NotImplementedError, KeyError, TypeError, IndexError, AttributeError, OSError,
            struct.error) as exc:
        describe = inspect_gguf(source, option)  # raises for a truncated or corrupt file (2-3 s on 100 MB)
        raise UnsupportedModelError(
            f"{option} = {str(source)!r}: transformers {converter_version()} cannot convert this GGUF checkpoint "
            f"({describe}): {type(exc).__name__}: {str(exc).rstrip('.')}. Use a GGUF of an architecture and "
            "quantization types transformers' GGUF support dequantizes (see its GGUF documentation), or the "
            "model's original Hugging Face checkpoint") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    packed = sorted({str(p.dtype) for p in model.parameters() if not p.is_floating_point()})
    if packed:  # weights left in GGUF blocks would be saved as raw bytes
        raise UnsupportedModelError(f"{option} = {str(source)!r} ({inspect_gguf(source, option)}): transformers "
                                    f"left weights packed (dtype {packed}) instead of dequantizing them to {dtype}; "
                                    "use a GGUF with other quantization types or the original Hugging Face "
                                    "checkpoint")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def inspect_gguf(source: Path, option: str) -> str:
    """'architecture X, tensor types [...]' of a readable GGUF file; ModelFileError naming it otherwise."""
    import gguf

    try:
        reader = gguf.GGUFReader(source)
        arch = reader.fields["general.architecture"].contents()
        types = sorted({t.tensor_type.name for t in reader.tensors})
    except (ValueError, IndexError, KeyError, OSError, EOFError, struct.error) as exc:
        raise ModelFileError(
            f"{option}: cannot read the GGUF file {str(source)!r} ({source.stat().st_size} bytes): "
            f"{type(exc).__name__}: {str(exc).rstrip('.')}. It is truncated or corrupt; download it again") from exc
    return f"architecture {arch!r}, tensor types {types}"
