"""The `tpu-plugins` command: info | demo-model | aot."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args: argparse.Namespace) -> int:
    from tpu_plugins import info

    report = info.collect()
    print(json.dumps(report, indent=2) if args.json else info.render(report))
    return 0


def _cmd_demo_model(args: argparse.Namespace) -> int:
    from tpu_plugins import demo_model

    path = demo_model.prepare(force=args.force)
    print(path)
    return 0


def _cmd_aot(args: argparse.Namespace) -> int:
    from tpu_plugins import aot

    request = aot.AotRequest(model=args.model, topology=args.topology, tensor_parallel_size=args.tp,
                             expert_parallel_size=args.ep,
                             max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                             max_num_batched_tokens=args.max_num_batched_tokens, page_size=args.page_size,
                             dtype=args.dtype, memory_fraction=args.memory_fraction)
    report = aot.analyze(request)
    print(aot.to_json(report) if args.json else aot.render(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-plugins", description="TPU support for vLLM, SGLang and Hugging Face.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show the execution target, versions and adapters")
    p.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("demo-model", help="prepare the embedded SmolLM2-135M-Instruct folder and print its path")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached folder is intact")
    p.set_defaults(func=_cmd_demo_model)
    p = sub.add_parser("aot", help="compile a model's engine for a TPU slice on this machine: fit, HBM, decode speed",
                       description="Ahead-of-time compile the engine's decode and prefill steps for a TPU topology "
                                   "with abstract weights (a config.json is enough) and report HBM use and the "
                                   "estimated decode step against the roofline.")
    p.add_argument("--model", required=True, help="model folder, config.json, or a shipped config: "
                   "Llama-3.1-8B, Llama-3.1-70B, Qwen3-8B, Qwen3-32B, Mistral-7B, Qwen3-30B-A3B, Mixtral-8x7B")
    p.add_argument("--topology", required=True, help="libtpu's slice name, e.g. v5e:2x2, v5p:2x2x1, v6e:2x2, tpu7x:2x2x1")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: every device of the slice)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel size for mixture-of-experts models: how many "
                   "of the TP devices split the experts (default 1: experts split by intermediate size)")
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--max-num-seqs", type=int, required=True)
    p.add_argument("--max-num-batched-tokens", type=int, default=512, help="prefill chunk (default 512)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float32, or int8 (int8 weights, one "
                   "scale per output channel, bf16 activations and KV cache)")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="share of HBM the engine may use (default 0.9)")
    p.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    p.set_defaults(func=_cmd_aot)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tpu_plugins.errors import UserError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        # User-fixable problems get one line, not a traceback.
        print(f"tpu-plugins {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
