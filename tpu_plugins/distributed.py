"""Several hosts, one slice: joining JAX's multi-controller runtime.

A slice larger than one host (v5e-16, v6e-16 and up) runs one process per host, each driving
its own chips. `jax.distributed.initialize` joins them: afterwards `jax.devices()` lists every
host's chips, a mesh spans them all, and one jitted step runs SPMD on every host, each host
feeding the same inputs. Who the hosts are comes from, in order:

  * explicit arguments (vLLM's worker passes what its own rendezvous agreed), or the settings
    TPU_PLUGINS_COORDINATOR (host:port of host 0), TPU_PLUGINS_NUM_HOSTS and TPU_PLUGINS_HOST_ID;
  * on a real TPU slice, JAX's own discovery from the TPU VM's environment (the metadata
    server, or TPU_WORKER_HOSTNAMES / TPU_WORKER_ID on GKE), when TPU_PLUGINS_NUM_HOSTS is set
    without a coordinator or the environment lists several workers.

Without a TPU (the simulated slice on CPU devices) collectives between processes go through
gloo. Joining must happen before JAX starts its backends: `runtime.current()` does it first.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tpu_plugins import runtime, settings
from tpu_plugins.errors import UserError

logger = logging.getLogger(__name__)

# A lost host is noticed by the others within this many seconds (JAX's default is 100).
HEARTBEAT_TIMEOUT_S = 30
# How long host 0 waits for every other host to join before giving up (JAX's default is 300).
JOIN_TIMEOUT_S = 300
_TPU_WORKER_LISTS = ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")


@dataclass(frozen=True)
class Hosts:
    """The processes of one slice. `coordinator` None: JAX discovers it (real TPU slices only)."""

    num_hosts: int
    host_id: int | None = None
    coordinator: str | None = None

    def __post_init__(self):
        if self.num_hosts < 1:
            raise UserError(f"A slice needs at least one host, got {self.num_hosts}.")
        if self.host_id is not None and not 0 <= self.host_id < self.num_hosts:
            raise UserError(f"Host id {self.host_id} is outside 0..{self.num_hosts - 1} for {self.num_hosts} hosts; "
                            "number the hosts from 0.")
        if self.coordinator is not None:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit():
                raise UserError(f"Coordinator {self.coordinator!r} is not host:port; give host 0's address and a "
                                "free port, for example 10.0.0.2:8476.")


def _tpu_environment_hosts() -> int:
    """Workers the TPU VM environment lists (GKE sets these; plain TPU VMs leave them unset)."""
    for name in _TPU_WORKER_LISTS:
        listed = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        if listed:
            return len(listed)
    return 1


def hosts_from_settings() -> Hosts | None:
    """The slice's hosts as the environment describes them; None for a single host."""
    conf = settings.multihost()
    if conf.coordinator or conf.host_id is not None:
        missing = [name for name, value in ((settings.NUM_HOSTS, conf.num_hosts), (settings.HOST_ID, conf.host_id),
                                            (settings.COORDINATOR, conf.coordinator)) if value is None]
        if missing:
            raise UserError("Multi-host settings are incomplete: " + ", ".join(missing) + " not set. Set all three "
                            f"on every host ({settings.COORDINATOR}=host0:port, {settings.NUM_HOSTS}=N, "
                            f"{settings.HOST_ID}=0..N-1), or none of them for one host.")
        return Hosts(conf.num_hosts, conf.host_id, conf.coordinator)
    if conf.num_hosts is not None and conf.num_hosts > 1:
        if not runtime.tpu_attached():
            raise UserError(f"{settings.NUM_HOSTS}={conf.num_hosts} without {settings.COORDINATOR}: only a real TPU "
                            "slice can discover its hosts. Elsewhere set the coordinator (host:port of host 0) and "
                            f"{settings.HOST_ID} on every process.")
        return Hosts(conf.num_hosts)
    listed = _tpu_environment_hosts() if runtime.tpu_attached() else 1
    return Hosts(listed) if listed > 1 else None


_joined: Hosts | None = None


def join(hosts: Hosts) -> None:
    """Join this process to the slice's other hosts. Call once, before JAX starts its backends;
    a second call with the same hosts does nothing."""
    global _joined
    if _joined is not None:
        if _joined != hosts:
            raise UserError(f"This process already joined {_joined}; it cannot join {hosts} as well.")
        return
    if hosts.num_hosts == 1:
        _joined = hosts
        return
    runtime.prepare_jax()
    if runtime._jax_initialised():
        raise UserError("JAX had started before the hosts were joined, so this process cannot take part in a "
                        "multi-host slice. Join first (tpu_plugins.distributed.join, or the TPU_PLUGINS_* host "
                        "settings) before any JAX computation.")
    import jax

    if not runtime.tpu_attached():
        # The simulated slice: CPU devices in every process, collectives between processes over TCP.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info("tpu-plugins: joining %s", hosts)
    try:
        jax.distributed.initialize(coordinator_address=hosts.coordinator, num_processes=hosts.num_hosts,
                                   process_id=hosts.host_id, initialization_timeout=JOIN_TIMEOUT_S,
                                   heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    except Exception as exc:   # JAX raises a bare RuntimeError/XlaRuntimeError with the gRPC status
        raise UserError(f"Could not join the {hosts.num_hosts}-host slice as host {hosts.host_id} through "
                        f"{hosts.coordinator or 'the TPU environment'}: {str(exc).splitlines()[0]}. Check that every "
                        "host started with the same coordinator and host count, each with its own host id, and "
                        "that host 0 can be reached on that port.") from None
    _joined = hosts


def join_from_settings() -> None:
    """Join the hosts the environment describes, if any (idempotent)."""
    if _joined is None:
        hosts = hosts_from_settings()
        if hosts is not None:
            join(hosts)


def free_port() -> int:
    """A free TCP port on this host, for host 0's coordinator."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
