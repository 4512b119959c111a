"""int8 weights against bf16, in one script: accuracy and speed on the demo model, and HBM on TPU slices.

1. Accuracy (SmolLM2-135M, JAX CPU): bf16 generates greedily; bf16 and int8 then read the same
   text teacher-forced (tpu_plugins/quality.py): top-1 agreement of the next token and the
   logit error over the generated positions; plus how long each greedy continuation stays equal.
   For scale, bf16 and int8 are also compared with float32 the same way.
2. Decode speed (same model, same prompts): the engine with int8 weights against bf16. On the
   JAX CPU stand-in this measures XLA CPU's int8->bf16 conversion, not a TPU's HBM saving.
3. HBM (libtpu, ahead of time): Llama-3.1-8B on v5e:2x2 and v6e:2x2, 16 sequences x 2048,
   `tpu-plugins aot --dtype int8` against bf16: weights per chip, the largest KV cache that fits,
   and the estimated decode step (memory-bound: int8 halves the weight bytes each step reads).
Last line: top1_agreement=<a> greedy_identical=<g> weight_bytes_ratio=<w> cpu_decode_int8_vs_bf16=<r>
           v5e_weights_ratio=<x> v6e_weights_ratio=<y> v6e_kv_tokens_ratio=<k> v6e_est_step_ratio=<s>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import aot_report, prompt_token_ids  # noqa: E402

from tpu_plugins import demo_model, quality  # noqa: E402
from tpu_plugins.engine import Engine, EngineConfig  # noqa: E402
from tpu_plugins.offline import GenerationParams, OfflineGenerator  # noqa: E402

def decode_tok_s(path, prompts, max_tokens, **options) -> float:
    engine = Engine(EngineConfig(model=path, dtype="bfloat16", max_model_len=512, max_num_seqs=len(prompts),
                                 max_num_batched_tokens=256, progress=False, **options))
    engine.warmup()
    generator = OfflineGenerator(engine)
    start = time.perf_counter()
    outs = generator.generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    path = demo_model.prepare()
    prompts = prompt_token_ids(AutoTokenizer.from_pretrained(path), args.num_prompts, 16, 160)
    r = quality.compare(path, prompts, baseline={"dtype": "bfloat16"},
                        candidate={"dtype": "bfloat16", "quantization": "int8"}, max_tokens=args.max_tokens)
    print(f"accuracy, SmolLM2-135M, {r['prompts']} prompts x {r['max_tokens']} tokens ({r['positions']} positions):")
    print(f"  next-token top-1 agreement with bf16: {r['top1_agreement']:.3f}")
    print(f"  logit error: max {r['max_abs_logit_error']:.3f}, mean |error| / logit std "
          f"{r['mean_abs_logit_error_over_logit_std']:.4f}")
    print(f"  greedy continuations identical to bf16: {r['greedy_identical_sequences']:.2f} of prompts; "
          f"mean identical prefix {r['greedy_prefix_mean']:.1f} of {r['max_tokens']} tokens")
    # For scale: how far bf16 itself, and int8, are from float32 on the same text.
    for name, candidate in (("bf16", {"dtype": "bfloat16"}), ("int8", {"dtype": "bfloat16", "quantization": "int8"})):
        f = quality.compare(path, prompts, baseline={"dtype": "float32"}, candidate=candidate, max_tokens=args.max_tokens)
        print(f"  for scale, {name} against float32: top-1 agreement {f['top1_agreement']:.3f}, mean |error| / logit "
              f"std {f['mean_abs_logit_error_over_logit_std']:.4f}, greedy identical {f['greedy_identical_sequences']:.2f}, "
              f"mean identical prefix {f['greedy_prefix_mean']:.1f}", flush=True)
    wb = r["weight_bytes"]
    print(f"  weights: bf16 {wb['baseline'] / 2**20:.1f} MiB, int8 {wb['candidate'] / 2**20:.1f} MiB "
          f"(ratio {r['weight_bytes_ratio']:.3f}; embedding and tied LM head stay bf16)", flush=True)

    bf16_s = decode_tok_s(path, prompts, 64)
    int8_s = decode_tok_s(path, prompts, 64, quantization="int8")
    print(f"decode on JAX CPU, {len(prompts)} prompts x 64 tokens: bf16 {bf16_s:.1f} tok/s, int8 {int8_s:.1f} tok/s "
          f"(ratio {int8_s / bf16_s:.2f})", flush=True)

    print("Llama-3.1-8B, 16 sequences x 2048, TP over the slice (per chip):")
    print(f"{'slice':10s} {'dtype':9s} {'weights GiB':>11s} {'HBM GiB':>8s} {'KV tokens that fit':>19s} "
          f"{'est. step ms':>12s} {'roofline ms':>11s}")
    ratios = {}
    for topology in ("v5e:2x2", "v6e:2x2"):
        reports = {dtype: aot_report("Llama-3.1-8B", topology, "--dtype", dtype) for dtype in ("bfloat16", "int8")}
        for dtype, rep in reports.items():
            print(f"{topology:10s} {dtype:9s} {rep['hbm_breakdown_per_chip']['weights'] / 2**30:11.2f} "
                  f"{rep['hbm_bytes_per_chip'] / 2**30:8.2f} {rep['kv_cache_tokens']:19d} "
                  f"{rep['est_decode_step_s'] * 1e3:12.3f} {rep['roofline_decode_step_s'] * 1e3:11.3f}", flush=True)
        gen = topology.split(":")[0]
        b, q = reports["bfloat16"], reports["int8"]
        ratios[gen] = {"weights": q["hbm_breakdown_per_chip"]["weights"] / b["hbm_breakdown_per_chip"]["weights"],
                       "kv": q["kv_cache_tokens"] / b["kv_cache_tokens"],
                       "step": q["est_decode_step_s"] / b["est_decode_step_s"]}
    print(f"top1_agreement={r['top1_agreement']:.3f} greedy_identical={r['greedy_identical_sequences']:.2f} "
          f"weight_bytes_ratio={r['weight_bytes_ratio']:.3f} cpu_decode_int8_vs_bf16={int8_s / bf16_s:.2f} "
          f"v5e_weights_ratio={ratios['v5e']['weights']:.3f} v6e_weights_ratio={ratios['v6e']['weights']:.3f} "
          f"v6e_kv_tokens_ratio={ratios['v6e']['kv']:.3f} v6e_est_step_ratio={ratios['v6e']['step']:.3f}")


if __name__ == "__main__":
    main()
