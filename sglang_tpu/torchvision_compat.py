"""Patch point (named and contained): SGLang 0.5.23 imports torchvision at module level for
two vision configs (`configs/nano_nemotron_vl.py` through `multimodal/internvl_utils.py`, and
`configs/deepseek_ocr.py`), which `sglang.srt.configs` imports for every model. Our environment
has the CPU build of torch, and the only torchvision wheels available are CUDA builds that
cannot load beside it. Text models never call those transforms.

`install()` adds an import hook for the `sglang.srt.configs` package alone: while that package
first executes, a stand-in `torchvision` offering just the names those two modules read at
import (`torchvision.transforms`, `.functional`, `InterpolationMode`) is present; afterwards it
is removed, so transformers and everything else still see no torchvision. transformers'
availability checks are settled before the stand-in appears, so it never caches a wrong answer.
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

TARGET = "sglang.srt.configs"
_NAMES = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")


class _InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def _stand_in() -> dict[str, types.ModuleType]:
    modules = {}
    for name in _NAMES:
        module = types.ModuleType(name, "tpu-plugins stand-in: torchvision is not installed")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        module.InterpolationMode = _InterpolationMode
        modules[name] = module
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    return modules


class _ConfigsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)          # one use: find the real spec, then wrap its loader
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithStandIn(spec.loader)
        return spec


class _WithStandIn(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()               # cache the true answer first
        import transformers.models.auto.processing_auto  # noqa: F401  (imports that check torchvision)

        added = {n: m for n, m in _stand_in().items() if n not in sys.modules}
        sys.modules.update(added)
        try:
            self.loader.exec_module(module)
        finally:
            for name in added:
                sys.modules.pop(name, None)


def needed() -> bool:
    return importlib.util.find_spec("torchvision") is None and TARGET not in sys.modules


def install() -> None:
    """Idempotent; does nothing when torchvision exists or SGLang's configs are already imported."""
    if needed() and not any(isinstance(f, _ConfigsFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ConfigsFinder())
