"""The HBM and ICI bytes a compiled TPU program moves, read from XLA's optimized HLO.

Why not `cost_analysis()["bytes accessed"]`: on TPU it adds up every operand and result of every
instruction whatever memory it lives in. After XLA's memory-space assignment many weights are
prefetched from HBM into VMEM, so the count has them twice (the HBM->VMEM copy and the fusion's
read from VMEM), and a Pallas call is charged its whole aliased operands (the full KV cache for a
kernel that writes 16 rows). For Llama-3.1-8B decode on v6e:2x2 it reported 8.5 GB per chip
where the program reads 4.9 GB. Its `optimal_seconds` comes out negative once Pallas calls are
present (libtpu 0.0.42.1). So we count from the compiled program itself:

* each top-level instruction's operands and results that live in HBM (no memory-space mark in
  their layout; `S(1)` is VMEM);
* an HBM->VMEM prefetch (`copy-start`, `slice-start`) once, for the bytes it copies;
* collectives' results as ICI traffic;
* Pallas calls (`tpu_custom_call`) not at all: XLA cannot see inside them, so the caller accounts
  for them from the bytes the kernel must move, and gets their names here.

Only the entry computation is walked: the engine's step has its layers unrolled and no loops;
`loops` counts any `while` found, whose bodies this does not count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([0-9,]*)\](?:\{([^}]*)\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_FREE = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "copy-done", "slice-done",
         "all-reduce-done", "all-gather-done", "collective-permute-done", "after-all", "partition-id", "replica-id"}
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass
class Traffic:
    hbm_bytes: int = 0
    ici_bytes: int = 0                   # result bytes of collectives (before the ring factor)
    collectives: int = 0
    custom_calls: list[str] = field(default_factory=list)   # op names of Pallas calls, not counted
    loops: int = 0


def _buffers(shape_text: str) -> list[tuple[int, bool]]:
    """(bytes, in HBM) for every array in a shape (a tuple has several)."""
    out = []
    for dtype, dims, layout in _SHAPE.findall(shape_text):
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        out.append((count * _DTYPE_BYTES[dtype], "S(" not in (layout or "")))
    return out


def _hbm(shape_text: str) -> int:
    return sum(size for size, in_hbm in _buffers(shape_text) if in_hbm)


def entry_computation(hlo_text: str) -> list[str]:
    start = hlo_text.index("\nENTRY")
    end = hlo_text.find("\n}\n", start)
    return hlo_text[start:end if end >= 0 else None].splitlines()[1:]


def measure(hlo_text: str) -> Traffic:
    traffic = Traffic()
    shapes: dict[str, str] = {}
    for line in entry_computation(hlo_text):
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, result, op, rest = match.groups()
        shapes[name] = result
        if op in _FREE:
            continue
        operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        if op == "custom-call" and 'custom_call_target="tpu_custom_call"' in line:
            label = re.search(r'op_name="([^"]*)"', line)
            traffic.custom_calls.append(label.group(1) if label else name)
            continue
        if op == "while":
            traffic.loops += 1
        if op in ("copy-start", "slice-start"):
            # Result: (source, destination, context) for slice-start; (destination, source, context) for copy-start.
            buffers = _buffers(result)
            size, dst_in_hbm = buffers[1] if op == "slice-start" else buffers[0]
            src_in_hbm = any(h for _, h in _buffers(shapes.get(operands[0], ""))) if operands else False
            traffic.hbm_bytes += size * (int(src_in_hbm) + int(dst_in_hbm))
            continue
        traffic.hbm_bytes += _hbm(result) + sum(_hbm(shapes.get(o, "")) for o in operands)
        if op.startswith(_COLLECTIVES):
            traffic.collectives += 1
            traffic.ici_bytes += sum(size for size, _ in _buffers(result))
    return traffic
