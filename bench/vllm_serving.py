"""vLLM's own serving benchmark (`vllm bench serve`, random prompts) against `vllm serve --device tpu`.

Demo model in float32 on JAX's CPU backend standing in for the TPU. Concurrency 1, 8 and 32;
prints output tokens/s, TTFT and TPOT (median, p99) for each, and how many programs the
engine compiled after warm-up during the whole run (target 0).
Last line: vllm_out_tok_s=<x at concurrency 32> recompiles=<m>
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402

from tpu_plugins import demo_model  # noqa: E402


def main() -> None:
    args = serving.load_args(__doc__)

    model = str(demo_model.prepare())
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    port = serving.free_port()
    log = work / "server.log"
    env = {"TPU_PLUGINS_DEVICE": "tpu"}
    server = serving.start([str(serving.BIN / "vllm"), "serve", model, "--device", "tpu", "--host", "127.0.0.1",
                            "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
                            "--max-num-seqs", str(max(args.concurrency)), "--max-num-batched-tokens", "512",
                            "--served-model-name", "smollm2"],
                           log, f"http://127.0.0.1:{port}/health", env)
    rows = []
    try:
        for concurrency in args.concurrency:
            name = f"c{concurrency}.json"
            subprocess.run([str(serving.BIN / "vllm"), "bench", "serve", "--backend", "openai", "--base-url",
                            f"http://127.0.0.1:{port}", "--model", "smollm2", "--tokenizer", model,
                            "--dataset-name", "random", "--random-input-len", str(args.input_len),
                            "--random-output-len", str(args.output_len), "--ignore-eos",
                            "--num-prompts", str(serving.num_prompts(args, concurrency)),
                            "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot",
                            "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(work),
                            "--result-filename", name, "--disable-tqdm"],
                           check=True, capture_output=True, text=True, env={**os.environ, **env})
            r = json.loads((work / name).read_text())
            rows.append((concurrency, r["output_throughput"], r["median_ttft_ms"], r["p99_ttft_ms"],
                         r["median_tpot_ms"], r["p99_tpot_ms"], r["completed"]))
            serving.print_row(concurrency, r)
    finally:
        serving.stop(server)
    recompiles = serving.recompiles_in_log(log)
    print(f"vllm_out_tok_s={rows[-1][1]:.2f} recompiles={recompiles}")


if __name__ == "__main__":
    main()
