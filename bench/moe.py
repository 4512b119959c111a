"""Mixture of experts, in one script: the engine against transformers on the CPU, and TPU slices ahead of time.

1. Throughput (JAX CPU standing in for the TPU): a random-weight Qwen3-MoE (6 layers, 32
   experts, top 4, hidden 512, fp32), 32 prompts of 16 to 256 tokens, 64 new tokens, greedy;
   the core engine (experts through ragged_dot) against transformers' generate in sorted,
   padded batches (engine_throughput.py's setting). Warm-up excluded for both.
2. TPU (libtpu, ahead of time): Qwen3-30B-A3B on v6e:2x2 with the experts split by expert
   (--ep 4) and by intermediate size (--ep 1), bf16 and int8, and Mixtral-8x7B on v6e:2x4
   (--ep 8); megablox is compiled by Mosaic for v6e. 16 sequences x 2048.
Last line: moe_engine_tok_s=<x> transformers_tok_s=<y> ratio=<x/y> same_tokens=<k>/<n>
           qwen3_30b_v6e_ep4_est_to_roofline=<r> mixtral_v6e_ep8_est_to_roofline=<m>
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import aot_report  # noqa: E402
from engine_throughput import run_transformers  # noqa: E402

from tpu_plugins.engine import Engine, EngineConfig  # noqa: E402
from tpu_plugins.offline import GenerationParams, OfflineGenerator  # noqa: E402

CONFIG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
              num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=32,
              num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=1024, tie_word_embeddings=False)
AOT_CASES = [("Qwen3-30B-A3B", "v6e:2x2", 4, "bfloat16"), ("Qwen3-30B-A3B", "v6e:2x2", 1, "bfloat16"),
             ("Qwen3-30B-A3B", "v6e:2x2", 4, "int8"), ("Mixtral-8x7B", "v6e:2x4", 8, "bfloat16")]


def save_model(folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**CONFIG), dtype=torch.float32)
    model.save_pretrained(folder)


def run_engine(folder, prompts, max_tokens):
    engine = Engine(EngineConfig(model=folder, dtype="float32", max_model_len=512, max_num_seqs=32,
                                 max_num_batched_tokens=512, progress=False))
    engine.warmup()
    start = time.perf_counter()
    outs = OfflineGenerator(engine).generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start), outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    save_model(folder)
    rng = np.random.default_rng(0)
    lengths = np.linspace(16, 256, args.num_prompts).round().astype(int)
    rng.shuffle(lengths)
    prompts = [rng.integers(3, CONFIG["vocab_size"], size=n).tolist() for n in lengths]
    engine_tok_s, outs = run_engine(folder, prompts, args.max_tokens)
    print(f"engine: {engine_tok_s:.1f} new tok/s", flush=True)
    hf_tok_s, hf_outs = run_transformers(folder, prompts, args.max_tokens, args.hf_batch_size)
    print(f"transformers (sorted padded batches of {args.hf_batch_size}): {hf_tok_s:.1f} new tok/s", flush=True)
    same = sum(o.token_ids == hf_outs[i] for i, o in enumerate(outs))
    print(f"greedy outputs identical for {same}/{len(prompts)} prompts", flush=True)

    print("ahead of time, 16 sequences x 2048 (per chip):")
    results = {}
    for model, topology, ep, dtype in AOT_CASES:
        r = aot_report(model, topology, "--ep", str(ep), "--dtype", dtype)
        results[(model, ep, dtype)] = r
        print(f"  {model:14s} {topology:8s} TP={r['tensor_parallel_size']} EP={ep} {dtype:8s} fits={r['fits']!s:5s} "
              f"weights {r['hbm_breakdown_per_chip']['weights'] / 2**30:6.2f} GiB, HBM {r['hbm_bytes_per_chip'] / 2**30:6.2f}"
              f"/{r['hbm_capacity_per_chip'] / 2**30:.0f} GiB, est {r['est_decode_step_s'] * 1e3:7.3f} ms, roofline "
              f"{r['roofline_decode_step_s'] * 1e3:7.3f} ms, ratio {r['est_to_roofline']:.3f}, "
              f"{r['decode_accounting_per_chip']['pallas_calls']} Pallas calls, compiled in {r['compile_s']} s",
              flush=True)
    qwen = results[("Qwen3-30B-A3B", 4, "bfloat16")]
    mixtral = results[("Mixtral-8x7B", 8, "bfloat16")]
    print(f"moe_engine_tok_s={engine_tok_s:.2f} transformers_tok_s={hf_tok_s:.2f} ratio={engine_tok_s / hf_tok_s:.2f} "
          f"same_tokens={same}/{len(prompts)} qwen3_30b_v6e_ep4_est_to_roofline={qwen['est_to_roofline']:.3f} "
          f"mixtral_v6e_ep8_est_to_roofline={mixtral['est_to_roofline']:.3f}")


if __name__ == "__main__":
    main()
