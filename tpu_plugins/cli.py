"""The `tpu-plugins` command: info | demo-model."""

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-plugins", description="TPU support for vLLM, SGLang and Hugging Face.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="show the execution target, versions and adapters")
    p.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    p.set_defaults(func=_cmd_info)
    p = sub.add_parser("demo-model", help="prepare the embedded SmolLM2-135M-Instruct folder and print its path")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached folder is intact")
    p.set_defaults(func=_cmd_demo_model)
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
