"""Will a model fit, and how fast will it decode, on a TPU slice we do not have?

`analyze(AotRequest(...))` builds the engine with abstract weights (a config.json is enough) on
libtpu's compile-only devices for the slice, compiles the engine's real decode and prefill steps
(the programs the adapters run, Pallas kernels included) and reads back:

* HBM per chip: weights and KV cache (from the shardings), activations (the step's other
  inputs and outputs), compiler temporaries and program code (`memory_analysis()`);
* the largest KV cache that fits in `memory_fraction` of HBM, as the engine would size it;
* the decode step time. Estimated: the HBM bytes the compiled program moves (see hlo_traffic.py
  for why not cost_analysis's own byte count), plus what the Pallas kernels must move (the KV
  pages attention reads, the rows the cache update writes), against HBM bandwidth; the flops
  (XLA's count plus attention's) against peak; the slower of the two, plus the ICI bytes of the
  tensor-parallel all-reduces against ICI bandwidth. Roofline: the least any implementation must
  move (every weight once except the embedding table, of which only the batch's rows; every
  cached K/V once) and compute, the slower of the two. XLA's raw cost_analysis figures are
  reported too.

Decode is measured with every sequence at `max_model_len` (the worst case the slice must hold).
"""

from __future__ import annotations

from tpu_plugins import jax_env  # noqa: F401  (settles JAX's platform before jax is imported)

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import numpy as np

from tpu_plugins import hlo_traffic, topology
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.errors import UserError
from tpu_plugins.models.moe import EXPERT_WEIGHTS

REFERENCE_CONFIGS = Path(__file__).parent / "reference_configs"
# --dtype -> (the engine's dtype, its quantization): int8 is bf16 activations with int8 weights.
AOT_DTYPES = {"bfloat16": ("bfloat16", None), "float32": ("float32", None), "int8": ("bfloat16", "int8")}


@dataclass
class AotRequest:
    model: str                     # model folder, config.json, or a shipped name such as "Llama-3.1-8B"
    topology: str                  # libtpu's name, e.g. "v6e:2x2"
    max_model_len: int
    max_num_seqs: int
    tensor_parallel_size: int | None = None    # default: every device of the slice
    expert_parallel_size: int = 1              # of the TP devices, how many split a MoE model's experts
    max_num_batched_tokens: int = 512
    page_size: int = 16
    dtype: str = "bfloat16"
    memory_fraction: float = 0.9


def reference_models() -> list[str]:
    return sorted(p.stem for p in REFERENCE_CONFIGS.glob("*.json"))


def resolve_model(model: str) -> Path:
    path = Path(model)
    if path.exists():
        return path
    shipped = {name.lower(): REFERENCE_CONFIGS / f"{name}.json" for name in reference_models()}
    if model.lower() in shipped:
        return shipped[model.lower()]
    raise UserError(f"No model at {model!r}: pass a model folder, a config.json, or one of the shipped configs: "
                    f"{', '.join(reference_models())}.")


def _per_device_bytes(tree) -> int:
    """Bytes one device holds of abstract arrays (each leaf's shard, or all of it if replicated)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shard)) * np.dtype(leaf.dtype).itemsize
    return total


def _weight_bytes_per_host(tree) -> int:
    """Weight bytes the busiest host loads: the shards of its own devices, a shard that several
    of its devices hold counted once. What each host of a multi-host slice reads (loader.py)."""
    per_host: dict[int, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        shards: dict[tuple, int] = {}     # (host, shard's slices) -> elements
        for device, index in leaf.sharding.devices_indices_map(leaf.shape).items():
            key = (device.process_index, tuple((s.start, s.stop, s.step) for s in index))
            shards[key] = int(np.prod([len(range(*s.indices(n))) for s, n in zip(index, leaf.shape)]))
        for (host, _), elements in shards.items():
            per_host[host] = per_host.get(host, 0) + elements * np.dtype(leaf.dtype).itemsize
    return max(per_host.values())


def _per_device_elements(tree) -> int:
    """Weight elements one device holds (int8 values count as elements, like bf16 ones)."""
    return sum(int(np.prod(leaf.sharding.shard_shape(leaf.shape))) for leaf in jax.tree_util.tree_leaves(tree))


def _expert_accounting(engine: Engine, tokens: int) -> dict:
    """A mixture-of-experts decode step, per device: its expert weights, the share of them the
    step reads and the experts' flops. Routing is taken as uniform: each expert is hit by at
    least one of the tokens x top_k pairs with probability 1 - (1 - 1/E)^(tokens x top_k)."""
    layers = [layer for layer in engine.params["layers"] if "router" in layer]
    if not layers:
        return {"bytes": 0, "bytes_read": 0, "elements": 0, "flops": 0, "in_pallas_kernels": False, "touched": 0.0}
    trees = [{n: layer[n] for n in EXPERT_WEIGHTS} for layer in layers]
    total = _per_device_bytes(trees)
    elements = _per_device_elements(trees)
    moe = engine.moe
    touched = 1 - (1 - 1 / moe.num_experts) ** (tokens * moe.top_k)
    int8 = engine.quantization == "int8"
    return {"bytes": total, "bytes_read": total * touched, "elements": elements, "touched": touched,
            # each pair multiplies by 3 of its expert's matrices; a device holds 1/devices of every expert's share
            "flops": 2 * tokens * moe.top_k * elements / moe.num_experts,
            "in_pallas_kernels": moe.implementation == "megablox" and not int8}


def analyze(request: AotRequest) -> dict:
    if request.dtype not in AOT_DTYPES:
        raise UserError(f"--dtype {request.dtype!r} is not one of: {', '.join(AOT_DTYPES)}.")
    tpu = topology.resolve(request.topology)
    tp = request.tensor_parallel_size or len(tpu.devices)
    if not 1 <= tp <= len(tpu.devices):
        raise UserError(f"--tp {tp} needs {tp} devices; {tpu.name} has {len(tpu.devices)} "
                        f"({tpu.num_chips} chips x {tpu.devices_per_chip}).")
    if tp % tpu.devices_per_chip:
        raise UserError(f"--tp {tp} must cover whole chips: {tpu.chip.generation} has {tpu.devices_per_chip} devices per chip.")
    ep = request.expert_parallel_size
    if ep < 1 or tp % ep:
        raise UserError(f"--ep {ep} must divide the tensor-parallel size {tp}.")
    mesh = jax.sharding.Mesh(np.array(tpu.devices[:tp]).reshape(1, ep, tp // ep), ("data", "expert", "model"))
    model_path = resolve_model(request.model)
    dtype, quantization = AOT_DTYPES[request.dtype]
    config = EngineConfig(model=model_path, dtype=dtype, quantization=quantization, max_model_len=request.max_model_len,
                          max_num_seqs=request.max_num_seqs, max_num_batched_tokens=request.max_num_batched_tokens,
                          page_size=request.page_size, memory_fraction=request.memory_fraction,
                          tensor_parallel_size=tp, expert_parallel_size=ep, attention="pallas", progress=False)
    engine = Engine(config, abstract=True, mesh=mesh, defer_kv_cache=True)
    cfg, layout = engine.model_config, engine.layout
    decode_shape = engine.bucket_for(request.max_num_seqs)
    prefill_shape = engine.bucket_for(request.max_num_batched_tokens)
    usable = int(tpu.hbm_bytes_per_device * request.memory_fraction)
    weights = _per_device_bytes(engine.params)

    started = time.perf_counter()
    needed_pages = engine.max_useful_pages()        # every sequence at full length
    compiler_refusal = None
    try:
        programs = _compile(engine, needed_pages, decode_shape, prefill_shape)
    except _OutOfHbm as exc:
        compiler_refusal = exc.message
        # Measure the programs with the cache that could fit beside the weights, if any could.
        fitting = (usable - weights) // engine.page_bytes_per_device()
        programs = None
        if fitting >= 2:
            try:
                programs = _compile(engine, min(int(fitting), needed_pages), decode_shape, prefill_shape)
            except _OutOfHbm:
                pass
    compile_s = time.perf_counter() - started
    if programs is None:
        return _refused(request, tpu, engine, tp, weights, compiler_refusal, compile_s)

    # -- memory, per device ---------------------------------------------------------------
    compiled_kv = _per_device_bytes(engine.kv_caches)
    page_bytes = engine.page_bytes_per_device()
    kv = needed_pages * page_bytes     # what this configuration needs, whatever cache the programs were built with
    stats = {name: p.memory_analysis() for name, p in programs.items()}
    activations = max(m.argument_size_in_bytes - weights - compiled_kv + m.output_size_in_bytes - m.alias_size_in_bytes
                      for m in stats.values())
    temporaries = max(m.temp_size_in_bytes for m in stats.values())
    code = sum(m.generated_code_size_in_bytes for m in stats.values())
    used = weights + kv + activations + temporaries + code
    capacity = tpu.hbm_bytes_per_device
    max_pages = max(0, (usable - weights - activations - temporaries - code) // page_bytes)

    # -- decode step time, per device ----------------------------------------------------------
    seqs, context = request.max_num_seqs, request.max_model_len
    decode_tokens = seqs   # one new token per sequence
    itemsize = np.dtype(engine.dtype).itemsize
    kv_heads_per_device = layout.num_kv_heads // tp
    heads_per_device = layout.num_heads // tp
    kv_read = cfg.num_layers * seqs * context * 2 * kv_heads_per_device * cfg.head_dim * itemsize
    kv_written = cfg.num_layers * decode_tokens * 2 * kv_heads_per_device * cfg.head_dim * itemsize
    q_and_out = cfg.num_layers * decode_tokens * 2 * heads_per_device * cfg.head_dim * itemsize
    attention_flops = cfg.num_layers * seqs * context * heads_per_device * cfg.head_dim * 4

    decode = programs["decode"]
    cost = decode.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    traffic = hlo_traffic.measure(decode.as_text())
    kernel_bytes = kv_read + 2 * kv_written + q_and_out    # the update kernel reads new rows, writes them
    experts = _expert_accounting(engine, decode_tokens)
    if experts["in_pallas_kernels"]:
        kernel_bytes += experts["bytes_read"]              # megablox reads the experts a step routes to
    est_bytes = traffic.hbm_bytes + kernel_bytes
    est_flops = float(cost.get("flops", 0.0)) + attention_flops
    ring = 2 * (tp - 1) / tp
    est_ici_s = traffic.ici_bytes * ring / tpu.ici_bytes_per_s_per_device if tp > 1 else 0.0
    bandwidth, peak = tpu.hbm_bytes_per_s_per_device, tpu.flops_per_s_per_device
    est_s = max(est_bytes / bandwidth, est_flops / peak) + est_ici_s

    embed = engine.params["embed"]
    embed_bytes = _per_device_bytes(embed)
    embed_rows_read = decode_tokens * cfg.hidden_size * itemsize
    # Every weight once, except the experts no token is routed to
    roofline_bytes = weights - embed_bytes - experts["bytes"] + experts["bytes_read"] + embed_rows_read + kv_read + kv_written
    matmul_params = _per_device_elements(engine.params) - _per_device_elements(embed) - experts["elements"]
    roofline_flops = 2 * matmul_params * decode_tokens + experts["flops"] + attention_flops
    roofline_s = max(roofline_bytes / bandwidth, roofline_flops / peak)

    xla_bytes = float(cost.get("bytes accessed", 0.0))
    xla_raw_s = max(xla_bytes / bandwidth, float(cost.get("flops", 0.0)) / peak) + kernel_bytes / bandwidth
    per_chip = tpu.devices_per_chip
    return {
        **_header(request, tpu, engine, tp),
        "programs": {name: {"tokens": shape[0], "seqs": shape[1]} for name, shape in
                     (("decode", decode_shape), ("prefill", prefill_shape)) if name in programs},
        "compile_s": round(compile_s, 1),
        "fits": compiler_refusal is None and used <= usable,
        "compiler_refusal": compiler_refusal,
        "hbm_bytes_per_chip": used * per_chip,
        "hbm_capacity_per_chip": capacity * per_chip,
        "memory_fraction": request.memory_fraction,
        "hbm_breakdown_per_chip": {"weights": weights * per_chip, "kv_cache": kv * per_chip,
                                   "activations": activations * per_chip, "temporaries": temporaries * per_chip,
                                   "program_code": code * per_chip},
        "kv_cache_pages": int(max_pages),
        "kv_cache_tokens": int(max_pages * request.page_size),
        "kv_cache_tokens_needed": seqs * context,
        "est_decode_step_s": est_s,
        "roofline_decode_step_s": roofline_s,
        "est_to_roofline": est_s / roofline_s,
        "est_decode_tokens_per_s": seqs / est_s,
        "roofline_decode_tokens_per_s": seqs / roofline_s,
        "decode_accounting_per_chip": {
            "hbm_bytes_xla_ops": traffic.hbm_bytes * per_chip, "hbm_bytes_pallas_kernels": kernel_bytes * per_chip,
            "pallas_calls": len(traffic.custom_calls), "flops": est_flops * per_chip,
            "expert_share_read": experts["touched"],
            "ici_bytes": traffic.ici_bytes * per_chip, "collectives": traffic.collectives,
            "ici_s": est_ici_s, "roofline_bytes": roofline_bytes * per_chip, "roofline_flops": roofline_flops * per_chip,
            "bound": "memory" if est_bytes / bandwidth >= est_flops / peak else "compute",
        },
        "xla_cost_analysis_decode": {
            "flops": float(cost.get("flops", 0.0)), "bytes_accessed": xla_bytes,
            "optimal_seconds": float(cost.get("optimal_seconds", float("nan"))),
            "step_s_from_bytes_accessed": xla_raw_s,
            "note": ("per device; bytes_accessed counts VMEM-side reads of prefetched weights and Pallas calls' whole "
                     "aliased operands, and optimal_seconds is negative when Pallas calls are present, so the "
                     "estimate above counts HBM traffic from the compiled program instead"),
        },
    }


class _OutOfHbm(Exception):
    def __init__(self, message: str):
        self.message = message


def _compile(engine: Engine, pages: int, decode_shape, prefill_shape) -> dict:
    """Compile decode and prefill with a `pages`-page cache; _OutOfHbm if XLA finds no room."""
    engine.allocate_kv_cache(pages)
    programs = {}
    try:
        programs["decode"] = engine.lower(*decode_shape).compile()
        if prefill_shape != decode_shape:
            programs["prefill"] = engine.lower(*prefill_shape).compile()
    except Exception as exc:   # XLA's JaxRuntimeError
        first = str(exc).splitlines()[0] if str(exc) else ""
        if "RESOURCE_EXHAUSTED" in first or "Ran out of memory" in first:
            raise _OutOfHbm(first) from None
        raise
    return programs


def _header(request: AotRequest, tpu, engine: Engine, tp: int) -> dict:
    """What was analysed: the leading keys of every report."""
    return {"model": str(engine.config.model), "architecture": engine.model_config.architecture,
            "topology": tpu.name, "chip": tpu.chip.generation, "chips": tp // tpu.devices_per_chip,
            # TPU hosts the chips sit on (libtpu's compile-only devices carry their host's index)
            "hosts": len({d.process_index for d in engine.mesh.devices.flat}),
            "weight_bytes_per_host": _weight_bytes_per_host(engine.params),
            "tensor_parallel_size": tp, "expert_parallel_size": request.expert_parallel_size, "dtype": request.dtype,
            "max_model_len": request.max_model_len,
            "max_num_seqs": request.max_num_seqs, "max_num_batched_tokens": request.max_num_batched_tokens,
            "page_size": request.page_size}


def _refused(request: AotRequest, tpu, engine: Engine, tp: int, weights: int, refusal: str, compile_s: float) -> dict:
    """Not even the weights and a minimal cache fit: what we know without a compiled program."""
    per_chip = tpu.devices_per_chip
    none = None
    return {
        **_header(request, tpu, engine, tp),
        "programs": {}, "compile_s": round(compile_s, 1),
        "fits": False, "compiler_refusal": refusal,
        "hbm_bytes_per_chip": weights * per_chip, "hbm_capacity_per_chip": tpu.hbm_bytes_per_device * per_chip,
        "memory_fraction": request.memory_fraction,
        "hbm_breakdown_per_chip": {"weights": weights * per_chip},
        "kv_cache_pages": 0, "kv_cache_tokens": 0,
        "kv_cache_tokens_needed": request.max_num_seqs * request.max_model_len,
        "est_decode_step_s": none, "roofline_decode_step_s": none, "est_to_roofline": none,
        "est_decode_tokens_per_s": none, "roofline_decode_tokens_per_s": none,
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def render(r: dict) -> str:
    if not r["programs"]:
        return (f"{Path(r['model']).name} ({r['architecture']}) on {r['topology']}, TP={r['tensor_parallel_size']}, "
                f"{r['dtype']}: does NOT fit. Weights alone take {_gib(r['hbm_bytes_per_chip'])} of "
                f"{_gib(r['hbm_capacity_per_chip'])} per chip; XLA: {r['compiler_refusal']}\n"
                "Use a larger slice (more chips for tensor parallelism) or a smaller model.")
    b = r["hbm_breakdown_per_chip"]
    a = r["decode_accounting_per_chip"]
    x = r["xla_cost_analysis_decode"]
    verdict = "fits" if r["fits"] else "does NOT fit"
    lines = [
        f"{Path(r['model']).name} ({r['architecture']}) on {r['topology']}: {r['chips']} x {r['chip']} chips"
        f"{f' on {hosts} hosts' if (hosts := r['hosts']) > 1 else ''}, "
        f"TP={r['tensor_parallel_size']}, {r['dtype']}, {r['max_num_seqs']} sequences x {r['max_model_len']} tokens",
        f"compiled decode {r['programs']['decode']} and prefill {r['programs'].get('prefill', '-')} in {r['compile_s']} s",
        "",
        f"HBM per chip: {_gib(r['hbm_bytes_per_chip'])} of {_gib(r['hbm_capacity_per_chip'])} "
        f"(usable at memory fraction {r['memory_fraction']}: {_gib(r['hbm_capacity_per_chip'] * r['memory_fraction'])}) -> {verdict}",
        f"  weights {_gib(b['weights'])}, KV cache {_gib(b['kv_cache'])}, activations {_gib(b['activations'])}, "
        f"compiler temporaries {_gib(b['temporaries'])}, program code {_gib(b['program_code'])}",
        *([f"  each host loads {_gib(r['weight_bytes_per_host'])} of weights (its own chips' shards)"]
          if r["hosts"] > 1 else []),
        *([f"  XLA refused the full cache: {r['compiler_refusal']}"] if r["compiler_refusal"] else []),
        f"largest KV cache that fits: {r['kv_cache_pages']} pages = {r['kv_cache_tokens']} tokens "
        f"(this configuration needs {r['kv_cache_tokens_needed']})",
        "",
        f"decode step, every sequence at {r['max_model_len']} tokens ({a['bound']}-bound):",
        f"  estimated {r['est_decode_step_s'] * 1e3:.3f} ms -> {r['est_decode_tokens_per_s']:.0f} tokens/s",
        f"  roofline  {r['roofline_decode_step_s'] * 1e3:.3f} ms -> {r['roofline_decode_tokens_per_s']:.0f} tokens/s",
        f"  estimate / roofline = {r['est_to_roofline']:.3f}",
        f"  per chip: XLA ops move {a['hbm_bytes_xla_ops'] / 1e9:.3f} GB of HBM; the {a['pallas_calls']} Pallas calls, "
        f"which XLA's cost model leaves out, are counted from the bytes they must move: {a['hbm_bytes_pallas_kernels'] / 1e9:.3f} GB; "
        f"roofline bytes {a['roofline_bytes'] / 1e9:.3f} GB; all-reduces {a['collectives']} x, {a['ici_s'] * 1e3:.3f} ms of ICI",
        f"  XLA cost_analysis (per device): flops {x['flops']:.3g}, bytes accessed {x['bytes_accessed'] / 1e9:.3f} GB, "
        f"optimal_seconds {x['optimal_seconds']:.3g}; from bytes accessed: {x['step_s_from_bytes_accessed'] * 1e3:.3f} ms",
    ]
    return "\n".join(lines)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
