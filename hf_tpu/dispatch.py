"""Runs one aten op on TpuTensors: lowered to JAX, decomposed, or (last resort) on the host.

Order for an op: our own handlers (moves, copies, in-place and out= forms, random fills,
foreach lists) -> torchax's JAX lowering -> a decomposition into other aten ops -> the op's
CompositeImplicit definition -> running it on the host CPU and copying results back (logged once
per op, so missing lowerings are visible, never wrong). Result dtypes follow torch's own rules:
the op runs on meta tensors first, which also gives torch's error for bad shapes or dtypes.
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.utils._pytree as pytree
from torch.utils._mode_utils import no_dispatch

from hf_tpu import torchax_ops
from hf_tpu.tensor import TpuTensor, device_dtype, from_host, jax_device, to_host, wrap

logger = logging.getLogger(__name__)
aten = torch.ops.aten
# int64 tensors keep int32 data on the device (tensor.py); JAX warns each time a lowering asks
# for int64. The tensor's torch dtype stays int64, so the warning says nothing to the user.
warnings.filterwarnings("ignore", message="Explicitly requested dtype int64 requested in", module="jax")
_host_fallback_logged: set[str] = set()


def run(func, args, kwargs):
    handler = _HANDLERS.get(func) or _HANDLERS.get(func.overloadpacket)
    if handler is not None:
        return handler(func, args, kwargs)
    name = func.overloadpacket.__name__
    if name.startswith("_foreach_"):
        return _foreach(func, args, kwargs)
    if func._schema.is_mutable:
        return _mutating(func, args, kwargs)
    return _functional(func, args, kwargs)


# ---- values in and out -------------------------------------------------------------------

def _index_of(args, kwargs) -> int:
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, TpuTensor):
            return leaf.device.index or 0
    return 0


def _to_jax(value, index):
    if isinstance(value, TpuTensor):
        return value._elem
    if isinstance(value, torch.Tensor):   # a host tensor mixed in (0-dim scalars, index lists)
        return from_host(value, index)._elem
    return value


def _unwrap(tree, index):
    return pytree.tree_map(lambda v: _to_jax(v, index), tree)


def _to_meta(tree):
    def meta(v):
        if isinstance(v, torch.Tensor):
            return torch.empty(v.shape, dtype=v.dtype, device="meta")
        if isinstance(v, torch.device):
            return torch.device("meta")
        return v

    return pytree.tree_map(meta, tree)


_meta_cache: dict = {}


def _signature(func, args, kwargs):
    """A hashable key for the op's output metadata, or None (then it is not cached)."""
    parts = [func]
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            parts.append((tuple(leaf.shape), leaf.dtype))
        elif isinstance(leaf, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)):
            parts.append(leaf)
        else:
            return None
    return tuple(parts)


def _meta_result(func, args, kwargs):
    """torch's own output metadata (dtype, shape), or None where the op has no meta kernel.

    Cached per op and argument shapes: running the meta kernel costs as much as the JAX op."""
    key = _signature(func, args, kwargs)
    if key is not None and key in _meta_cache:
        return _meta_cache[key]
    result = _run_meta(func, args, kwargs)
    if key is not None:
        if len(_meta_cache) > 100_000:
            _meta_cache.clear()
        _meta_cache[key] = result
    return result


def _run_meta(func, args, kwargs):
    try:
        with no_dispatch():
            return func(*_to_meta(args), **_to_meta(kwargs))
    except (NotImplementedError, RuntimeError) as error:
        if "meta" in str(error).lower() or isinstance(error, NotImplementedError):
            return None
        raise


def _rewrap(result, meta, index):
    import jax

    flat, spec = pytree.tree_flatten(result)
    metas = pytree.tree_leaves(meta) if meta is not None else []
    if len(metas) != len(flat):
        metas = [None] * len(flat)
    out = []
    for value, meta_value in zip(flat, metas):
        if isinstance(value, jax.Array):
            if isinstance(meta_value, torch.Tensor):
                dtype = meta_value.dtype
            else:
                dtype = _torch_dtype_of(value.dtype)
            value = wrap(value, dtype, index)
        out.append(value)
    return pytree.tree_unflatten(out, spec)


def _torch_dtype_of(jax_dtype):
    import jax.numpy as jnp

    table = {
        jnp.dtype("float32"): torch.float32, jnp.dtype("bfloat16"): torch.bfloat16,
        jnp.dtype("float16"): torch.float16, jnp.dtype("int32"): torch.int64,
        jnp.dtype("int64"): torch.int64, jnp.dtype("int16"): torch.int16, jnp.dtype("int8"): torch.int8,
        jnp.dtype("uint8"): torch.uint8, jnp.dtype("bool"): torch.bool, jnp.dtype("complex64"): torch.complex64,
    }
    return table[jnp.dtype(jax_dtype)]


def _traced(*trees) -> bool:
    import jax

    return any(isinstance(leaf, jax.core.Tracer) for leaf in pytree.tree_leaves(trees))


def _lookup(table, func):
    return table.get(func) or table.get(func.overloadpacket)


# ---- the op kinds --------------------------------------------------------------------------

def _functional(func, args, kwargs):
    lowerings, decompositions = torchax_ops.tables()
    lowering = _lookup(lowerings, func)
    if lowering is not None and lowering.needs_env:
        # Random ops draw from torch's own CPU generator, so torch.manual_seed and explicit
        # generators give exactly the numbers they give on the CPU.
        return _on_host(func, args, kwargs)
    if lowering is not None:
        meta = _meta_result(func, args, kwargs)   # torch's own checks raise here, before any JAX work
        index = _index_of(args, kwargs)
        jargs, jkwargs = _unwrap(args, index), _unwrap(kwargs, index)
        try:
            return _rewrap(lowering.func(*jargs, **jkwargs), meta, index)
        except Exception as error:
            # The op's inputs passed torch's checks, so this is a gap in the lowering: run torch's
            # own kernel on the host. Raising instead would be worse inside backward(), where an
            # exception from a PrivateUse1 kernel aborts the process (torch's device guard).
            if _traced(jargs, jkwargs):
                raise
            logger.warning("tpu: the JAX lowering of %s failed (%s: %s); running it on the host",
                           func, type(error).__name__, error)
            return _on_host(func, args, kwargs)
    decomposition = _lookup(decompositions, func) or torch._decomp.decomposition_table.get(func)
    if decomposition is not None:
        return decomposition(*args, **kwargs)
    decomposed = func.decompose(*args, **kwargs)
    if decomposed is not NotImplemented:
        return decomposed
    return _on_host(func, args, kwargs)


def _functional_form(func):
    """The out-of-place op an in-place (`add_.Tensor`) or out= (`add.out`) overload computes: the
    base op's non-mutating overload taking the same arguments, less the out= tensors."""
    packet_name = func.overloadpacket.__name__
    packet = getattr(aten, packet_name[:-1] if packet_name.endswith("_") else packet_name, None)
    if packet is None:
        return None
    written = set(_mutated_positions(func))
    wanted = [(a.name, str(a.type)) for i, a in enumerate(func._schema.arguments)
              if not (i in written and a.kwarg_only)]
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if not schema.is_mutable and [(a.name, str(a.type)) for a in schema.arguments] == wanted:
            return candidate
    return None


def _mutated_positions(func):
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _mutating(func, args, kwargs):
    schema_args = func._schema.arguments
    written = _mutated_positions(func)
    functional = _functional_form(func)
    if functional is None or len(written) != 1:
        return _on_host(func, args, kwargs)
    position = written[0]
    argument = schema_args[position]
    if argument.kwarg_only:
        target = kwargs[argument.name]
        kwargs = {k: v for k, v in kwargs.items() if k != argument.name}
    else:
        target = args[position] if position < len(args) else kwargs[argument.name]
    result = run(functional, args, kwargs)
    if isinstance(result, (tuple, list)):
        result = result[0]
    if isinstance(target, TpuTensor) and isinstance(result, TpuTensor) and target.shape != result.shape:
        # torch would resize the out= tensor; a wrapper's shape is fixed (factories that rely on
        # it are built on the host, torch_device.py), and callers keep the tensor they passed.
        raise RuntimeError(f"{func}: the out= tensor has shape {tuple(target.shape)} but the result has shape "
                           f"{tuple(result.shape)}; tpu tensors cannot be resized: pass an out= tensor of the "
                           "result's shape, or use the op without out=.")
    assign(target, result)
    return target


def assign(target, value):
    """Write `value` into `target` (a TpuTensor, or a host tensor for host outputs)."""
    import jax
    import jax.numpy as jnp

    if not isinstance(target, TpuTensor):
        with no_dispatch():
            target.copy_(to_host(value) if isinstance(value, TpuTensor) else value)
        return
    index = target.device.index or 0
    if isinstance(value, TpuTensor):
        elem = value._elem
        if (value.device.index or 0) != index:
            elem = jax.device_put(elem, jax_device(index))
    elif isinstance(value, torch.Tensor):
        elem = from_host(value, index)._elem
    else:
        elem = jnp.asarray(value)
    elem = jnp.broadcast_to(elem.astype(device_dtype(target.dtype)), tuple(target.shape))
    target._elem = elem


def _foreach(func, args, kwargs):
    """`_foreach_op(lists...)` as the plain op at each position (optimizers, gradient clipping).

    Arguments map by name: list arguments give their i-th element, `scalars` the i-th scalar,
    and names that are keyword-only in the plain op are passed as keywords."""
    name = func.overloadpacket.__name__.removeprefix("_foreach_")
    in_place = name.endswith("_")
    if name == "norm":
        base = lambda t, ord=2, dtype=None: torch.linalg.vector_norm(t, ord, dtype=dtype)  # noqa: E731
        keyword_only = {"dtype"}
    else:
        base = getattr(aten, name)
        keyword_only = {a.name for o in base.overloads() for a in getattr(base, o)._schema.arguments if a.kwarg_only}
    bound = dict(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs)
    length = max(len(v) for v in bound.values() if isinstance(v, (list, tuple)))
    results = []
    for i in range(length):
        positional, keyword = [], {}
        for argument in func._schema.arguments:
            if argument.name not in bound:
                continue
            value = bound[argument.name]
            if isinstance(value, (list, tuple)):
                value = value[i]
            elif argument.name == "scalars" and isinstance(value, torch.Tensor):
                value = value[i].item()
            key = "value" if argument.name == "scalars" and "value" in keyword_only else argument.name
            if key in keyword_only:
                keyword[key] = value
            else:
                positional.append(value)
        results.append(base(*positional, **keyword))
    return None if in_place else results


def _on_host(func, args, kwargs):
    """Last resort: run the op on the CPU and bring results back; in-place writes land too."""
    name = str(func)
    if name not in _host_fallback_logged:
        _host_fallback_logged.add(name)
        logger.info("tpu: %s has no JAX lowering; running it on the host", name)
    index = _index_of(args, kwargs)
    host_args, host_kwargs = pytree.tree_map_only(TpuTensor, to_host, (args, kwargs))
    with no_dispatch():
        result = func(*host_args, **host_kwargs)
    for position in _mutated_positions(func):
        argument = func._schema.arguments[position]
        original = args[position] if position < len(args) else kwargs.get(argument.name)
        changed = host_args[position] if position < len(args) else host_kwargs.get(argument.name)
        if isinstance(original, TpuTensor):
            assign(original, changed)

    def back(v):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            for original, host in zip(pytree.tree_leaves((args, kwargs)), pytree.tree_leaves((host_args, host_kwargs))):
                if host is v and isinstance(original, TpuTensor):
                    return original
            return from_host(v, index)
        return v

    return pytree.tree_map(back, result)


# ---- handlers for ops that need more than a lowering ---------------------------------------

def _to_copy(func, args, kwargs):
    source = args[0]
    dtype = kwargs.get("dtype") or source.dtype
    device = kwargs.get("device") or source.device
    device = torch.device(device)
    if device.type != "tpu":
        host = to_host(source).to(dtype)
        return host if device.type == "cpu" else host.to(device)
    index = device.index or 0
    elem = source._elem
    if (source.device.index or 0) != index:
        import jax

        elem = jax.device_put(elem, jax_device(index))
    return wrap(elem, dtype, index)


def _copy_(func, args, kwargs):
    target, source = args[0], args[1]
    assign(target, source)
    return target


def _alias(func, args, kwargs):
    source = args[0]
    return TpuTensor(source._elem, source.dtype, source.device.index or 0)


def _item(func, args, kwargs):
    return to_host(args[0]).item()


def _empty_like(func, args, kwargs):
    source = args[0]
    dtype = kwargs.get("dtype") or source.dtype
    device = torch.device(kwargs.get("device") or source.device)
    if device.type != "tpu":
        with no_dispatch():
            return torch.empty(source.shape, dtype=dtype, device=device)
    return zeros(tuple(source.shape), dtype, device.index)


def zeros(shape, dtype, index) -> TpuTensor:
    import jax
    import jax.numpy as jnp

    index = 0 if index is None else index
    return TpuTensor(jax.device_put(jnp.zeros(shape, device_dtype(dtype)), jax_device(index)), dtype, index)


def _on_host_handler(func, args, kwargs):
    return _on_host(func, args, kwargs)


def _set_data(func, args, kwargs):
    target, source = args[0], args[1]
    assign(target, source)
    return target


def set_item(tensor: TpuTensor, key, value) -> None:
    """`tensor[key] = value` as one functional update of the tensor's data."""
    index = tensor.device.index or 0

    def convert(k):
        if isinstance(k, TpuTensor):
            return k._elem
        if isinstance(k, torch.Tensor):
            return k.numpy()
        return k

    key = tuple(convert(k) for k in key) if isinstance(key, tuple) else convert(key)
    elem = _to_jax(value, index) if isinstance(value, torch.Tensor) else value
    if hasattr(elem, "astype"):
        elem = elem.astype(device_dtype(tensor.dtype))
    tensor._elem = tensor._elem.at[key].set(elem)


_HANDLERS = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.lift_fresh.default: _alias,
    aten.clone.default: _alias,        # data is immutable: sharing it is a copy
    aten._local_scalar_dense.default: _item,
    aten.empty_like.default: _empty_like,
    aten.set_.source_Tensor: _set_data,
    # random fills: drawn by torch's CPU generator (see _functional)
    aten.normal_.default: _on_host_handler,
    aten.uniform_.default: _on_host_handler,
    aten.bernoulli_.float: _on_host_handler,
    aten.random_.default: _on_host_handler,
    getattr(aten.random_, "from"): _on_host_handler,
    aten.random_.to: _on_host_handler,
    aten.exponential_.default: _on_host_handler,
}
