"""Zero-copy reading of safetensors files: each tensor is a NumPy view of the memory-mapped file.

We parse the format ourselves (8-byte little-endian header length, JSON header, raw bytes)
because it lets bf16 tensors come back as ml_dtypes.bfloat16 views without a framework in
between, and nothing is read until a tensor is used.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from tpu_plugins.errors import UserError

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}


class SafetensorsFile:
    def __init__(self, path: Path):
        self.path = path
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            (header_len,) = struct.unpack("<Q", self._map[:8])
            header = json.loads(self._map[8:8 + header_len])
        except (struct.error, ValueError) as exc:
            raise UserError(f"{path} is not a valid safetensors file ({exc}); re-download or re-convert it.") from None
        header.pop("__metadata__", None)
        self._base = 8 + header_len
        self.entries: dict = header

    def tensor(self, name: str) -> np.ndarray:
        info = self.entries[name]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise UserError(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}.")
        start, end = info["data_offsets"]
        return np.frombuffer(self._map, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                             offset=self._base + start).reshape(info["shape"])


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder: single file or a sharded index."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"No *.safetensors weights in {folder}; only safetensors checkpoints can be loaded.")
    return files


def iterate_tensors(folder: Path) -> Iterator[tuple[str, "callable"]]:
    """(name, loader) pairs over every tensor of the checkpoint; loader() returns the view."""
    for file in checkpoint_files(folder):
        st = SafetensorsFile(file)
        for name in st.entries:
            yield name, (lambda st=st, name=name: st.tensor(name))
