"""Meshes over a simulated 8-device slice: named axes, real sharded compute, clear errors."""

from conftest import run_json, run_python

SHARDED_MATMUL = """
import json
import numpy as np
from tpu_plugins.mesh import MeshShape, make_mesh
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = make_mesh(MeshShape(data=2, model=4))
x = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 100
w = np.arange(16 * 32, dtype=np.float32).reshape(16, 32) / 100
xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
ws = jax.device_put(w, NamedSharding(mesh, P(None, "model")))
y = jax.jit(jnp.dot, out_shardings=NamedSharding(mesh, P("data", "model")))(xs, ws)
print(json.dumps({
    "axes": list(mesh.axis_names), "shape": dict(mesh.shape),
    "shards": len(y.addressable_shards), "shard_shape": list(y.addressable_shards[0].data.shape),
    "max_err": float(np.abs(np.asarray(y) - x @ w).max()),
}))
"""


def test_mesh_axes_and_sharded_matmul_on_simulated_slice():
    out = run_json(SHARDED_MATMUL, TPU_PLUGINS_SIM_DEVICES="8")
    assert out["axes"] == ["data", "expert", "model"]
    assert out["shape"] == {"data": 2, "expert": 1, "model": 4}
    assert out["shards"] == 8 and out["shard_shape"] == [4, 8]
    assert out["max_err"] < 1e-3


def test_mesh_larger_than_the_slice_is_a_clear_error():
    proc = run_python("from tpu_plugins.mesh import MeshShape, make_mesh; make_mesh(MeshShape(model=8))",
                      TPU_PLUGINS_SIM_DEVICES="4")
    assert proc.returncode != 0
    assert "needs 8 devices, but only 4 are visible" in proc.stderr
    assert "TPU_PLUGINS_SIM_DEVICES=8" in proc.stderr
