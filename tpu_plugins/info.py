"""`tpu-plugins info`: what was found, which versions, and which adapters would activate."""

from __future__ import annotations

from importlib import metadata

from tpu_plugins import activation, chips, runtime

# Adapter -> (host framework distributions, the entry point groups we register in it).
ADAPTERS = {
    "vllm": (("vllm",), ("vllm.platform_plugins",)),
    "sglang": (("sglang",), ("sglang.srt.platforms", "sglang.srt.plugins")),
    "hf": (("transformers", "diffusers", "accelerate", "torch"), ("torch.backends",)),
}
STACK = ("tpu-plugins", "jax", "jaxlib", "libtpu", "numpy")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _registered(group: str) -> bool:
    return any(ep.dist and ep.dist.name == "tpu-plugins" for ep in metadata.entry_points(group=group))


def collect() -> dict:
    """Everything `info` reports, as plain data."""
    rt = runtime.current()
    requested = activation.tpu_requested()
    adapters = {}
    for name, (dists, groups) in ADAPTERS.items():
        versions = {dist: _version(dist) for dist in dists}
        installed = versions[dists[0]] is not None
        adapters[name] = {
            "framework_versions": versions,
            "installed": installed,
            "entry_points_registered": all(_registered(g) for g in groups),
            "would_activate": installed and requested,
        }
    return {
        "runtime": rt.as_dict(),
        "summary": rt.describe(),
        "tpu_requested": requested,
        "versions": {dist: _version(dist) for dist in STACK},
        "adapters": adapters,
        "known_generations": list(chips.CHIPS),
    }


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"


def render(report: dict) -> str:
    rt = report["runtime"]
    lines = [f"backend: {rt['kind']}" + (" (simulated TPU slice)" if rt["simulated"] else ""), f"  {report['summary']}"]
    lines.append(f"  JAX platform {rt['platform']}, device kind {rt['device_kind']!r}, "
                 f"{rt['num_devices']} local / {rt['num_global_devices']} global device(s), {rt['num_hosts']} host(s)")
    if rt["kind"] == "tpu":
        lines.append(f"  generation {rt['generation']}, {rt['num_chips']} chip(s), {rt['cores_per_chip']} TensorCore(s)/chip, "
                     f"HBM {_gib(rt['hbm_bytes_per_device'])}/device, topology {rt['topology']}")
    else:
        lines.append(f"  memory per device: {_gib(rt['hbm_bytes_per_device'])}")
    lines.append("versions:")
    lines += [f"  {dist}: {ver or 'not installed'}" for dist, ver in report["versions"].items()]
    lines.append(f"TPU requested (attached, --device tpu or TPU_PLUGINS_DEVICE=tpu): {'yes' if report['tpu_requested'] else 'no'}")
    lines.append("adapters:")
    for name, info in report["adapters"].items():
        fw = ", ".join(f"{d} {v or '-'}" for d, v in info["framework_versions"].items())
        state = "would activate" if info["would_activate"] else ("installed, idle" if info["installed"] else "framework not installed")
        reg = "entry points registered" if info["entry_points_registered"] else "entry points MISSING"
        lines.append(f"  {name}: {state}; {reg} ({fw})")
    return "\n".join(lines)
