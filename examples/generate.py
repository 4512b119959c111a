"""A short generation from the demo model through the core engine (no serving framework).

    .venv/bin/python examples/generate.py [--model PATH] [--prompt TEXT ...] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

from tpu_plugins import demo_model, runtime
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="Hugging Face model folder (default: the embedded demo model)")
    parser.add_argument("--prompt", action="append", help="a user message (repeatable)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on TPU, float32 elsewhere)")
    args = parser.parse_args()

    path = args.model or demo_model.prepare()
    prompts = args.prompt or ["What is the capital of France?", "Give me one reason to use a TPU."]
    dtype = args.dtype or ("bfloat16" if runtime.current().kind == "tpu" else "float32")
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = Engine(EngineConfig(model=path, dtype=dtype, max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=128))
    engine.warmup()
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"]
           for p in prompts]
    start = time.perf_counter()
    outs = OfflineGenerator(engine).generate(ids, GenerationParams(max_tokens=args.max_tokens))
    seconds = time.perf_counter() - start
    for prompt, out in zip(prompts, outs):
        print(f"\n>>> {prompt}\n{tokenizer.decode(out.token_ids, skip_special_tokens=True)}")
    new = sum(len(o.token_ids) for o in outs)
    print(f"\n{new} new tokens in {seconds:.2f} s on {runtime.current().describe()}; recompiles after warm-up: "
          f"{engine.counters.recompiles}")


if __name__ == "__main__":
    main()
