"""vLLM's Ray executor with one worker per TPU host, for slices larger than one host.

vLLM's `RayExecutorV2` starts one worker actor per placement-group bundle, broadcasts every
scheduled batch to all of them, and takes the output from rank 0. On TPU a worker is a host:
it drives all of its chips (SPMD), and the hosts together form one JAX mesh. What differs from
vLLM's GPU layout is only the placement: one bundle per host, and the worker sees all of its
host's chips. So this executor reserves the placement group itself before handing over to
vLLM's: bundles of one "TPU" each, spread over distinct hosts (on a real slice every host's
Ray node advertises its chips as "TPU"; the simulated slice's Ray head is started with
`--resources '{"TPU": N}'`), and Ray is told not to narrow TPU_VISIBLE_CHIPS to one chip
(platform.ray_noset_device_env_vars). If a worker dies, vLLM's worker monitor shuts the
executor down and the engine reports the failure.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm.logger import init_logger
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2
from vllm.v1.executor.ray_utils import ray

from tpu_plugins import activation, runtime
from tpu_plugins.errors import UserError

logger = init_logger("vllm.tpu_plugins")

RAY_TPU_RESOURCE = "TPU"
PLACEMENT_TIMEOUT_S = 120
# Set in every worker before it imports anything: the worker must resolve our platform.
WORKER_ENV = {"TPU_PLUGINS_DEVICE": activation.DEVICE_NAME, "VLLM_USE_V2_MODEL_RUNNER": "0"}


def ray_cluster_started() -> bool:
    """Whether a Ray cluster is there to join: RAY_ADDRESS, or the address file `ray start`
    leaves on this host. Otherwise Ray would start a fresh one-node cluster without the other
    hosts, and serving would fail only after it had started."""
    if os.environ.get("RAY_ADDRESS", "").strip():
        return True
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:   # another Ray layout: let Ray itself decide
        return True
    return Path(get_ray_address_file(None)).exists()


def _one_bundle_per_host(hosts: int):
    """A placement group of `hosts` bundles, one "TPU" each, each on its own Ray node on a real
    slice. The simulated slice runs every host on one Ray node, so there the bundles pack."""
    available = ray.cluster_resources().get(RAY_TPU_RESOURCE, 0)
    nodes = sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get(RAY_TPU_RESOURCE))
    real_slice = runtime.tpu_attached()
    if available < hosts or (real_slice and nodes < hosts):
        raise UserError(
            f"--tensor-parallel-size needs {hosts} TPU hosts, but the Ray cluster has {nodes} node(s) with TPU "
            f"resources ({available:g} chips). Start Ray on every host of the slice first: `ray start --head` on "
            "host 0, `ray start --address=HOST0:6379` on the others (see the README, Multi-host slices), then "
            "run vllm serve on host 0." + ("" if real_slice else
                                           " Simulated on one machine: `ray start --head --resources "
                                           f"'{{\"TPU\": {hosts}}}'`."))
    group = ray.util.placement_group([{RAY_TPU_RESOURCE: 1.0}] * hosts,
                                     strategy="STRICT_SPREAD" if real_slice else "PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        raise UserError(f"Ray could not reserve one TPU host each for {hosts} workers within "
                        f"{PLACEMENT_TIMEOUT_S} s; check `ray status` for hosts busy with another job.")
    return group


class TpuRayExecutor(RayExecutorV2):
    def _init_executor(self) -> None:
        parallel = self.parallel_config
        if parallel.placement_group is None:
            if not ray.is_initialized():
                ray.init(runtime_env=parallel.ray_runtime_env)
            if not ray.util.get_current_placement_group():
                parallel.placement_group = _one_bundle_per_host(parallel.world_size)
        super()._init_executor()

    def _build_runtime_env(self) -> dict:
        runtime_env = super()._build_runtime_env()
        runtime_env.setdefault("env_vars", {}).update(WORKER_ENV)
        return runtime_env
