"""Every place the Hugging Face adapter changes a library's code, applied when that library loads.

Where transformers and accelerate have no hook for a device they do not know, we wrap one
function each:
- transformers `GenerationMixin.generate`: models on "tpu" generate on the core engine
  (hf_tpu/generation.py); anything else is transformers' own generate, untouched.
- accelerate `get_max_memory`: knows "tpu" devices and their HBM, so `device_map="auto"` sizes
  a model by the TPU's memory (hf_tpu/memory.py).
- transformers `modeling_utils._get_device_map`: after transformers plans the placement, a plan
  naming "tpu" is checked (device exists, dtype, fits in memory) before weights load
  (hf_tpu/placement.py).

And one registration through transformers' own hook, done when its module loads:
- the "tpu_int8" quantizer (`quantization_config=Int8Config()`, hf_tpu/quantization.py).

Each patch is applied the moment its module is imported (a post-import hook on sys.meta_path),
or at once when it already is, so `import torch` stays free of transformers and accelerate.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def _patch_generate():
    from hf_tpu import generation

    generation.install()


def _patch_accelerate_memory():
    from hf_tpu import memory

    memory.install()


def _patch_device_map_check():
    from hf_tpu import placement

    placement.install()


def _register_int8_quantizer():
    from hf_tpu import quantization

    if hasattr(quantization, "register"):   # else hf_tpu.quantization is importing and registers at its end
        quantization.register()


PATCHES = {
    # not a patch: transformers' own registration of an out-of-tree quantizer, once it loads
    "transformers.quantizers": _register_int8_quantizer,
    "transformers.modeling_utils": _patch_device_map_check,
    "transformers.generation.utils": _patch_generate,
    "accelerate.utils.modeling": _patch_accelerate_memory,
}
_applied: set[str] = set()


def _apply(name: str) -> None:
    with _lock:
        if name in _applied:
            return
        _applied.add(name)
    try:
        PATCHES[name]()
    except Exception:   # a failed patch leaves the library as it was; never break its import
        logger.warning("tpu-plugins: could not patch %s", name, exc_info=True)


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds nothing itself; wraps the real loader of a patched module to patch it after exec."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in PATCHES or fullname in _applied:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        real_loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return real_loader.create_module(spec)

            def exec_module(self, module):
                real_loader.exec_module(module)
                _apply(fullname)

        spec.loader = Loader()
        return spec


_finder = _AfterImport()


def install() -> None:
    for name in PATCHES:
        if name in sys.modules:
            _apply(name)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
