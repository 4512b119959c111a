"""Multi-host slices: the same 4-chip mesh as one process and as two hosts, and Llama-3.1-70B
compiled ahead of time for multi-host v5e/v6e slices.

    .venv/bin/python bench/multihost.py [--num-prompts 16] [--max-tokens 64]

On this CPU machine the two "hosts" are two processes on 127.0.0.1, each with two simulated
chips, joined by jax.distributed; their collectives cross processes over gloo (TCP), where on a
real slice they cross hosts over ICI. So the throughput ratio is the cost of the simulated
transport, not a TPU prediction; the bytes each host reads at load are what a real host reads.
The last line holds the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import aot_report, prompt_token_ids  # noqa: E402

AOT_CASES = [("v6e:2x4", 8), ("v6e:4x4", 16), ("v5e:4x4", 16)]   # slice, TP (every chip)


def worker(model: str, tp: int, num_prompts: int, max_tokens: int) -> None:
    """One process (one host of a slice, or the whole slice): load, warm up, generate; one JSON line."""
    from transformers import AutoTokenizer

    from tpu_plugins import runtime
    from tpu_plugins.engine import Engine, EngineConfig
    from tpu_plugins.offline import GenerationParams, OfflineGenerator

    started = time.perf_counter()
    engine = Engine(EngineConfig(model=model, dtype="float32", tensor_parallel_size=tp, max_model_len=512,
                                 max_num_seqs=num_prompts, max_num_batched_tokens=256, num_pages=1024, progress=False))
    load_s = time.perf_counter() - started
    engine.warmup()
    prompts = prompt_token_ids(AutoTokenizer.from_pretrained(model), num_prompts, 16, 128)
    generator = OfflineGenerator(engine)
    generator.generate(prompts[:2], GenerationParams(max_tokens=4, ignore_eos=True))
    started = time.perf_counter()
    outs = generator.generate(prompts, GenerationParams(max_tokens=max_tokens, ignore_eos=True))
    seconds = time.perf_counter() - started
    print(json.dumps({"hosts": runtime.current().num_hosts, "tok_s": sum(len(o.token_ids) for o in outs) / seconds,
                      "load_s": load_s, "read_fraction": engine.load_stats.read_fraction,
                      "tokens": [o.token_ids for o in outs]}))


def run(argv: list[str], env: dict, hosts: int) -> list[dict]:
    """`hosts` processes of this script's worker (one when hosts == 1), their JSON lines."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for host in range(hosts):
        host_env = {**os.environ, **env}
        if hosts > 1:
            host_env.update(TPU_PLUGINS_COORDINATOR=f"127.0.0.1:{port}", TPU_PLUGINS_NUM_HOSTS=str(hosts),
                            TPU_PLUGINS_HOST_ID=str(host))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *argv], env=host_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "TP", "PROMPTS", "TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model, tp, prompts, tokens = args.worker
        return worker(model, int(tp), int(prompts), int(tokens))

    from tpu_plugins import demo_model

    model = str(demo_model.prepare())
    argv = [model, "4", str(args.num_prompts), str(args.max_tokens)]
    print(f"SmolLM2-135M fp32, TP 4, {args.num_prompts} prompts of 16..128 tokens, {args.max_tokens} new tokens each",
          flush=True)
    single = run(argv, {"TPU_PLUGINS_SIM_DEVICES": "4"}, hosts=1)[0]
    print(f"  one process, 4 chips:       {single['tok_s']:7.1f} new tok/s, loaded in {single['load_s']:.1f} s, "
          f"read {single['read_fraction']:.2f} of the checkpoint", flush=True)
    hosts = run(argv, {"TPU_PLUGINS_SIM_DEVICES": "2"}, hosts=2)
    tok_s = min(h["tok_s"] for h in hosts)
    read = max(h["read_fraction"] for h in hosts)
    same = all(h["tokens"] == single["tokens"] for h in hosts)
    print(f"  two hosts x 2 chips (gloo): {tok_s:7.1f} new tok/s, loaded in {max(h['load_s'] for h in hosts):.1f} s, "
          f"each host read {read:.2f} of the checkpoint; greedy tokens identical to one process: {same}", flush=True)

    print("ahead of time, Llama-3.1-70B bf16, 32 sequences x 4096 tokens (per chip):")
    reports = {}
    for topology, tp in AOT_CASES:
        r = aot_report("Llama-3.1-70B", topology, "--tp", str(tp), max_model_len=4096, max_num_seqs=32)
        reports[topology] = r
        print(f"  {topology:8s} {r['chips']:2d} chips on {r['hosts']} hosts: fits={r['fits']!s:5s} weights "
              f"{r['hbm_breakdown_per_chip']['weights'] / 2**30:6.2f} GiB, HBM {r['hbm_bytes_per_chip'] / 2**30:6.2f}"
              f"/{r['hbm_capacity_per_chip'] / 2**30:.0f} GiB per chip, each host loads "
              f"{r['weight_bytes_per_host'] / 2**30:6.2f} GiB, KV tokens that fit {r['kv_cache_tokens']}, est "
              f"{r['est_decode_step_s'] * 1e3:7.3f} ms, roofline {r['roofline_decode_step_s'] * 1e3:7.3f} ms, "
              f"ratio {r['est_to_roofline']:.3f}", flush=True)
    v6e = reports["v6e:4x4"]
    print(f"multihost_tok_s={tok_s:.2f} single_process_tok_s={single['tok_s']:.2f} ratio={tok_s / single['tok_s']:.2f} "
          f"same_tokens={same} host_read_fraction={read:.3f} "
          f"llama70b_v6e_4x4_hbm_gib_per_chip={v6e['hbm_bytes_per_chip'] / 2**30:.2f} "
          f"llama70b_v6e_4x4_est_to_roofline={v6e['est_to_roofline']:.3f}")


if __name__ == "__main__":
    main()
