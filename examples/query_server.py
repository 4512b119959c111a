"""Query an OpenAI-compatible server (vllm serve / sglang.launch_server) with the openai client.

    .venv/bin/python examples/query_server.py --base-url http://127.0.0.1:8000/v1 [--model NAME]
"""

from __future__ import annotations

import argparse

import openai


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    args = parser.parse_args()

    client = openai.OpenAI(base_url=args.base_url, api_key="none")
    model = args.model or client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": args.prompt}],
                                           max_tokens=48, temperature=0)
    print(f">>> {args.prompt}\n{reply.choices[0].message.content}")
    print("streamed: ", end="", flush=True)
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to five."}],
                                                max_tokens=24, temperature=0, stream=True):
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()


if __name__ == "__main__":
    main()
