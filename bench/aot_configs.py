"""`tpu-plugins aot` for every shipped config on v5e, v6e and v7 slices, plus the published anchor's shape.

Each model goes on the smallest slice of each generation whose HBM holds its bf16 weights with
room for the cache, tensor-parallel over every device of the slice; 16 sequences of 2048
tokens (the decode step is measured with every sequence at full length). One subprocess per
case, so each compile starts clean. Writes the reports as a JSON list with --json.
Last line: aot_cases=<n> fit=<k> max_est_to_roofline=<r> llama8b_v6e_2x2_est_to_roofline=<r>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import aot_report  # noqa: E402
SLICES = {   # model -> slice per generation
    "Llama-3.1-8B": ("v5e:2x2", "v6e:2x2", "tpu7x:2x2x1"),
    "Mistral-7B": ("v5e:2x2", "v6e:2x2", "tpu7x:2x2x1"),
    "Qwen3-8B": ("v5e:2x2", "v6e:2x2", "tpu7x:2x2x1"),
    "Qwen3-32B": ("v5e:2x4", "v6e:2x2", "tpu7x:2x2x1"),
    "Llama-3.1-70B": ("v5e:4x4", "v6e:2x4", "tpu7x:2x2x1"),
}
# sglang-jax's published figure: Llama-3.1-8B on v6e-4 (TP=4), 512 in / 512 out, concurrency 16, TPOT 9.9 ms.
ANCHOR = {"model": "Llama-3.1-8B", "topology": "v6e:2x2", "max_model_len": 1024, "max_num_seqs": 16,
          "published_tpot_ms": 9.9, "source": "sglang-jax, Llama-3.1-8B, v6e-4, TP=4, 512/512, concurrency 16"}


def run_case(model: str, topology: str, max_model_len: int, max_num_seqs: int) -> dict:
    return aot_report(model, topology, max_model_len=max_model_len, max_num_seqs=max_num_seqs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--models", nargs="+", default=list(SLICES))
    parser.add_argument("--json", type=Path, help="write every report here")
    args = parser.parse_args()

    reports = []
    for model in args.models:
        for topology in SLICES[model]:
            r = run_case(model, topology, args.max_model_len, args.max_num_seqs)
            reports.append(r)
            est = r["est_decode_step_s"]
            print(f"{model:14s} {topology:12s} TP={r['tensor_parallel_size']:<3d} fits={r['fits']!s:5s} "
                  f"HBM/chip {r['hbm_bytes_per_chip'] / 2**30:6.2f}/{r['hbm_capacity_per_chip'] / 2**30:.0f} GiB  "
                  + (f"est {est * 1e3:7.3f} ms  roofline {r['roofline_decode_step_s'] * 1e3:7.3f} ms  "
                     f"ratio {r['est_to_roofline']:.3f}" if est else "not compiled"), flush=True)
    anchor = run_case(ANCHOR["model"], ANCHOR["topology"], ANCHOR["max_model_len"], ANCHOR["max_num_seqs"])
    anchor["anchor"] = ANCHOR
    reports.append(anchor)
    print(f"anchor: {ANCHOR['source']}: published TPOT {ANCHOR['published_tpot_ms']} ms; our decode step estimate at "
          f"{ANCHOR['max_model_len']} tokens of context: {anchor['est_decode_step_s'] * 1e3:.3f} ms "
          f"(roofline {anchor['roofline_decode_step_s'] * 1e3:.3f} ms)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    cases = [r for r in reports if "anchor" not in r]
    ratios = [r["est_to_roofline"] for r in cases if r["est_to_roofline"]]
    target = next(r for r in cases if r["model"].endswith("Llama-3.1-8B.json") and r["topology"] == "v6e:2x2")
    print(f"aot_cases={len(cases)} fit={sum(r['fits'] for r in cases)} max_est_to_roofline={max(ratios):.3f} "
          f"llama8b_v6e_2x2_est_to_roofline={target['est_to_roofline']:.3f}")


if __name__ == "__main__":
    main()
