"""torchax's table of aten-op lowerings to JAX, loaded as a library.

We use torchax (Google's PyTorch-on-JAX library) for one thing: its ~430 aten lowerings
(`torchax.ops.jaten`) and its decomposition table. The tensor type, the device and the
dispatcher are ours (`hf_tpu/tensor.py`, `hf_tpu/dispatch.py`), because torchax's own
package init would claim torch's PrivateUse1 slot as "jax", and its tensors only work inside a
thread-local torch mode that transformers' weight-loading threads do not inherit.

Narrow compatibility fix (torchax 0.0.13 on torch 2.13): torchax's tables name 22 named-tensor
("Dimname") overloads that torch 2.13 no longer has, and `import torchax` stops with
`aten.prod has no overload 'dim_Dimname'`. While the tables load, a missing overload resolves
to an inert placeholder key that can never match a real op; nothing else is changed, and the
lookup is restored afterwards. Remove when torchax supports torch 2.13.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import types

_lock = threading.Lock()


class _MissingOverload:
    """Placeholder for an overload this torch build does not have (a dict key, never called)."""

    def __init__(self, qualified_name: str):
        self.qualified_name = qualified_name

    def __repr__(self):
        return f"<missing overload {self.qualified_name}>"


@functools.cache
def tables():
    """(lowerings, decompositions): dicts keyed by OpOverload / OpOverloadPacket."""
    with _lock:
        import torch

        from tpu_plugins import runtime

        runtime.prepare_jax()   # before torchax imports jax

        spec = importlib.util.find_spec("torchax")
        if spec is None:
            raise ImportError("torchax is not installed: pip install 'tpu-plugins[hf]'")
        if "torchax" not in sys.modules:
            # The package without its __init__ (see the module docstring); submodules load as usual.
            package = types.ModuleType("torchax")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["torchax"] = package

        packet = torch._ops.OpOverloadPacket
        original_getattr = packet.__getattr__

        def getattr_or_placeholder(self, key):
            try:
                return original_getattr(self, key)
            except AttributeError:
                if key.startswith("__"):
                    raise
                return _MissingOverload(f"{self._qualified_op_name}.{key}")

        packet.__getattr__ = getattr_or_placeholder
        try:
            from torchax import decompositions
            from torchax.ops import jaten, ops_registry  # noqa: F401  (registers the lowerings)
        finally:
            packet.__getattr__ = original_getattr
        lowerings = {k: v for k, v in ops_registry.all_aten_ops.items() if v.is_jax_function}
        return lowerings, dict(decompositions.DECOMPOSITIONS)
