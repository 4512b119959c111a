"""Engine vs plain transformers `generate` on the demo model, same prompts, same machine, one run.

SmolLM2-135M in float32 on JAX's CPU backend (standing in for the TPU), 64 prompts of 16 to
512 tokens, 64 new tokens each, greedy. transformers runs its strongest plain setting we found:
prompts sorted by length into padded batches (left padding, SDPA attention), which minimises
padding. Throughput counts new tokens per second of wall time, warm-up excluded for both.
Last line: engine_tok_s=<x> transformers_tok_s=<y> ratio=<x/y> warmup_compiles=<n> recompiles=<m>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import prompt_token_ids  # noqa: E402

from tpu_plugins import demo_model  # noqa: E402
from tpu_plugins.engine import Engine, EngineConfig  # noqa: E402
from tpu_plugins.offline import GenerationParams, OfflineGenerator  # noqa: E402


def run_engine(path, prompts, max_tokens, args):
    engine = Engine(EngineConfig(model=path, dtype="float32", max_model_len=1024, max_num_seqs=args.max_num_seqs,
                                 max_num_batched_tokens=args.max_num_batched_tokens, progress=False))
    start = time.perf_counter()
    engine.warmup()
    warmup_s = time.perf_counter() - start
    gen = OfflineGenerator(engine)
    start = time.perf_counter()
    outs = gen.generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True))
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return tokens / seconds, warmup_s, engine.counters, outs


def run_transformers(path, prompts, max_tokens, batch_size):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outputs: dict[int, list[int]] = {}

    def batch_generate(indices):
        width = max(len(prompts[i]) for i in indices)
        ids = torch.zeros((len(indices), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(indices):   # left padding
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=0)
        return out[:, width:]

    batch_generate(order[:2])   # warm-up
    start = time.perf_counter()
    for b in range(0, len(order), batch_size):
        chunk = order[b:b + batch_size]
        for row, new in zip(chunk, batch_generate(chunk)):
            outputs[row] = new.tolist()
    seconds = time.perf_counter() - start
    return sum(len(v) for v in outputs.values()) / seconds, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--shortest", type=int, default=16)
    parser.add_argument("--longest", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    path = demo_model.prepare()
    prompts = prompt_token_ids(AutoTokenizer.from_pretrained(path), args.num_prompts, args.shortest, args.longest)
    engine_tok_s, warmup_s, counters, engine_outs = run_engine(path, prompts, args.max_tokens, args)
    print(f"engine: {engine_tok_s:.1f} new tok/s (warm-up {warmup_s:.1f} s, {counters.warmup_compiles} programs)", flush=True)
    hf_tok_s, hf_outs = run_transformers(path, prompts, args.max_tokens, args.hf_batch_size)
    print(f"transformers (sorted padded batches of {args.hf_batch_size}): {hf_tok_s:.1f} new tok/s", flush=True)
    same = sum(o.token_ids == hf_outs[i] for i, o in enumerate(engine_outs))
    print(f"greedy outputs identical for {same}/{len(prompts)} prompts (batched padding changes transformers' "
          "numerics slightly, so a few may differ)", flush=True)
    print(f"engine_tok_s={engine_tok_s:.2f} transformers_tok_s={hf_tok_s:.2f} ratio={engine_tok_s / hf_tok_s:.2f} "
          f"warmup_compiles={counters.warmup_compiles} recompiles={counters.recompiles}")


if __name__ == "__main__":
    main()
