"""Probe: the torch "tpu" device against torch on CPU. Prints one JSON document.

Run with TPU_PLUGINS_DEVICE=tpu (registration at `import torch` through the entry point).
Each check records the CPU result and the tpu result; the test compares them.
"""

import copy
import json
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

out = {"privateuse1_name": torch._C._get_privateuse1_backend_name(),
       "is_available": torch.tpu.is_available(), "device_count": torch.tpu.device_count()}


def diff(a, b) -> float:
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max())


torch.manual_seed(0)
x = torch.randn(5, 7)
y = x.to("tpu")
out["to_device"] = {"device": str(y.device), "dtype": str(y.dtype), "roundtrip": diff(y.cpu(), x)}
ops = {
    "arith": lambda t: (t * 2 + 1).exp().sum(dim=1),
    "matmul": lambda t: t @ t.T,
    "softmax": lambda t: torch.softmax(t, -1),
    "index": lambda t: t[1:4, ::2],
    "where": lambda t: torch.where(t > 0, t, torch.zeros_like(t)),
    "cat": lambda t: torch.cat([t, t.abs()], 0),
    "argmax": lambda t: t.argmax(-1),
    "cumsum": lambda t: t.cumsum(0),
    "topk": lambda t: t.topk(3, dim=-1).values,
}
out["ops"] = {name: diff(f(x), f(y)) for name, f in ops.items()}
out["argmax_dtype"] = str(y.argmax(-1).dtype)
ints = torch.arange(10, device="tpu") * 3
out["int64"] = {"dtype": str(ints.dtype), "values": ints.cpu().tolist(), "cpu_dtype": str(ints.cpu().dtype)}
bf = x.to(torch.bfloat16).to("tpu")
out["bfloat16"] = {"dtype": str(bf.dtype), "roundtrip": diff(bf.cpu(), x.to(torch.bfloat16))}
out["factories"] = {
    "zeros": torch.zeros(2, 3, device="tpu").cpu().tolist(),
    "full": torch.full((2,), 7.0, device="tpu").cpu().tolist(),
    "tensor": torch.tensor([1, 2, 3], device="tpu").cpu().tolist(),
    "linspace": diff(torch.linspace(0, 1, 5, device="tpu"), torch.linspace(0, 1, 5)),
}
z = y.clone()
z[1, 2:5] = 9.0
ref = x.clone()
ref[1, 2:5] = 9.0
out["setitem"] = diff(z, ref)
w = y.clone()
w.add_(1.0).mul_(2.0)
w.add_(y, alpha=3).clamp_(max=4.0)
out["inplace"] = diff(w, ((x + 1) * 2 + 3 * x).clamp(max=4.0))
target = torch.zeros(5, 7, device="tpu")
returned = torch.add(y, y, alpha=2, out=target)
out["out_variant"] = {"same_tensor": returned is target, "diff": diff(target, x + 2 * x)}
out["item"] = float(y[0, 0].item()) == float(x[0, 0].item())

# Same random numbers as the CPU for the same seed (drawn by torch's CPU generator).
torch.manual_seed(3)
r_tpu = torch.randn(4, device="tpu").cpu()
torch.manual_seed(3)
r_cpu = torch.randn(4)
out["random_same_as_cpu"] = diff(r_tpu, r_cpu)

# Module.to keeps Parameter objects (optimizers and tied weights stay valid); autograd.
lin = torch.nn.Linear(7, 3)
ref_lin = copy.deepcopy(lin)
weight_object = lin.weight
optimizer = torch.optim.SGD(lin.parameters(), lr=0.1)
lin.to("tpu")
out["module_to"] = {"same_parameter": lin.weight is weight_object, "device": str(lin.weight.device),
                    "is_parameter": isinstance(lin.weight, torch.nn.Parameter)}
loss = lin(y).pow(2).mean()
loss.backward()
ref_loss = ref_lin(x).pow(2).mean()
ref_loss.backward()
out["autograd"] = {"loss": diff(loss, ref_loss), "grad": diff(lin.weight.grad, ref_lin.weight.grad),
                   "grad_device": str(lin.weight.grad.device)}
optimizer.step()
torch.optim.SGD(ref_lin.parameters(), lr=0.1).step()
out["optimizer_step"] = diff(lin.weight, ref_lin.weight)


def in_thread(i):
    t = torch.full((3,), float(i)).to("tpu")
    return (t * 2).cpu().tolist()


with ThreadPoolExecutor(4) as pool:
    out["threads"] = list(pool.map(in_thread, range(4)))
out["pickle"] = diff(pickle.loads(pickle.dumps(y)), x)
out["deepcopy_device"] = str(copy.deepcopy(y).device)

errors = {}
for name, make in {"missing_index": lambda: torch.ones(2, device="tpu:7"),
                   "float64": lambda: torch.ones(2, dtype=torch.float64).to("tpu"),
                   "out_resize": lambda: torch.add(y, y, out=torch.empty(0, device="tpu"))}.items():
    try:
        make()
        errors[name] = None
    except Exception as exc:   # noqa: BLE001 - the message is what is checked
        errors[name] = f"{type(exc).__name__}: {exc}"
out["errors"] = errors

# torch.compile(backend="tpu"): a host graph compiled into one jax.jit program, with an
# in-place input update; and a module already on "tpu".
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
inputs = torch.randn(3, 8)
with torch.no_grad():
    eager = model(inputs)
    compiled = torch.compile(model, backend="tpu")(inputs)


def write_cache(cache, k, pos):
    cache.index_copy_(0, pos, k)
    return cache.sum(0) * 2


c_eager, c_compiled = torch.zeros(4, 3), torch.zeros(4, 3)
k, pos = torch.randn(1, 3), torch.tensor([2])
r_eager = write_cache(c_eager, k, pos)
r_compiled = torch.compile(write_cache, backend="tpu")(c_compiled, k, pos)
model.to("tpu")
with torch.no_grad():
    on_device = torch.compile(model, backend="tpu")(inputs.to("tpu"))
out["compile"] = {"host_graph": diff(compiled, eager), "host_device": str(compiled.device),
                  "mutation_result": diff(r_compiled, r_eager), "mutation_input": diff(c_compiled, c_eager),
                  "tpu_inputs": diff(on_device, eager), "tpu_device": str(on_device.device)}
# A lowering that fails inside backward(): the op runs on the host instead (an exception from a
# PrivateUse1 kernel in the autograd engine would abort the process).
from hf_tpu import torchax_ops  # noqa: E402

lowerings, _ = torchax_ops.tables()
mm = next(v for k, v in lowerings.items() if str(k) in ("aten.mm", "aten.mm.default"))
working = mm.func


def broken(*args, **kwargs):
    raise RuntimeError("injected lowering failure")


mm.func = broken
a, b = torch.randn(3, 4), torch.randn(4, 5)
a_tpu, a_cpu = a.to("tpu").requires_grad_(True), a.clone().requires_grad_(True)
(a_tpu @ b.to("tpu")).sum().backward()
(a_cpu @ b).sum().backward()
mm.func = working
out["lowering_failure_in_backward"] = diff(a_tpu.grad, a_cpu.grad)
import tempfile  # noqa: E402

from accelerate import Accelerator  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    out["trainer_device"] = str(TrainingArguments(output_dir=tmp).device)
out["accelerator_device"] = str(Accelerator().device)
json.dump(out, sys.stdout)
print()
