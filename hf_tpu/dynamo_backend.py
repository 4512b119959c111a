"""torch.compile backend "tpu": an FX graph from TorchDynamo becomes one jax.jit program.

transformers compiles its static-cache decode step with `backend="tpu"` on "tpu" devices, and
users may write `torch.compile(fn, backend="tpu")`. The graph runs under jax.jit with its
inputs as TpuTensors holding JAX tracers, so every aten op goes through the same lowering as
eager execution (dispatch.py) and XLA fuses the whole graph. In-place updates of inputs (a
static KV cache's `index_copy_`) come back as extra outputs and are written to the inputs.
Host-tensor inputs are moved to the device and results brought back, so the caller's devices
do not change.

TorchDynamo cannot look inside TpuTensors (their data are JAX arrays, not torch storage), so it
treats each op on them as opaque: code whose tensors are already on "tpu" runs op by op inside
torch.compile, with the same results. The compiled path for the architectures the core engine
serves is the engine itself (generation.py).
"""

from __future__ import annotations

import torch

from hf_tpu.tensor import TpuTensor, from_host, to_host


def tpu(gm: torch.fx.GraphModule, example_inputs):
    import hf_tpu

    hf_tpu.enable()
    return CompiledGraph(gm)


class CompiledGraph:
    """Call with the graph's real inputs; one program per input signature (shapes, dtypes)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self._programs: dict = {}

    def __call__(self, *inputs):
        on_device = any(isinstance(x, TpuTensor) for x in inputs)
        index = next((x.device.index or 0 for x in inputs if isinstance(x, TpuTensor)), 0)
        positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        tensors = [inputs[i] if isinstance(inputs[i], TpuTensor) else from_host(inputs[i], index) for i in positions]
        arrays = [t._elem for t in tensors]
        dtypes = tuple(t.dtype for t in tensors)
        key = (tuple((a.shape, str(a.dtype)) for a in arrays), dtypes,
               tuple(x for x in inputs if not isinstance(x, torch.Tensor)))
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = _Program(self.gm, list(inputs), positions, dtypes, index)
        outputs, updated = program(arrays)
        # Inputs the graph changed in place (e.g. a static KV cache) get their new data.
        for position, tensor, new in zip(positions, tensors, updated):
            if new is None:
                continue
            tensor._elem = new
            if not isinstance(inputs[position], TpuTensor):
                with torch.no_grad():
                    inputs[position].copy_(to_host(tensor))
        if not on_device:
            outputs = [to_host(o) if isinstance(o, TpuTensor) else o for o in outputs]
        return outputs


class _Program:
    """The graph traced by jax.jit; output dtypes are recorded while tracing."""

    def __init__(self, gm, inputs, positions, dtypes, index):
        import jax

        self.gm, self.inputs, self.positions, self.dtypes, self.index = gm, inputs, positions, dtypes, index
        self.output_dtypes: list | None = None
        self.jitted = jax.jit(self._run)

    def _run(self, arrays):
        wrapped = [TpuTensor(a, d, self.index) for a, d in zip(arrays, self.dtypes)]
        args = list(self.inputs)
        for position, tensor in zip(self.positions, wrapped):
            args[position] = tensor
        with torch.no_grad():
            out = self.gm(*args)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        self.output_dtypes = [o.dtype if isinstance(o, TpuTensor) else None for o in out]
        results = [o._elem if isinstance(o, TpuTensor) else None for o in out]
        updated = [w._elem if w._elem is not a else None for w, a in zip(wrapped, arrays)]
        return results, updated

    def __call__(self, arrays):
        results, updated = self.jitted(arrays)
        outputs = [TpuTensor(e, d, self.index) if d is not None else None for e, d in zip(results, self.output_dtypes)]
        return outputs, updated
