"""SGLang's own serving benchmark (`python -m sglang.bench_serving`, random token ids) against
`python -m sglang.launch_server --device tpu`.

Demo model in float32 on JAX's CPU backend standing in for the TPU. Concurrency 1, 8 and 32;
prints output tokens/s, TTFT and TPOT (median, p99) for each, and how many programs the
engine compiled after warm-up during the whole run (target 0).
Last line: sglang_out_tok_s=<x at the highest concurrency> recompiles=<m>
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
    work = Path(tempfile.mkdtemp(prefix="sglang-bench-"))
    port = serving.free_port()
    log = work / "server.log"
    server = serving.start([str(serving.BIN / "python"), "-m", "sglang.launch_server", "--model-path", model,
                            "--device", "tpu", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                            "--context-length", "1024", "--max-running-requests", str(max(args.concurrency)),
                            "--chunked-prefill-size", "512", "--max-total-tokens", "65536"],
                           log, f"http://127.0.0.1:{port}/health")
    rows = []
    try:
        for concurrency in args.concurrency:
            out = work / f"c{concurrency}.jsonl"
            subprocess.run([str(serving.BIN / "python"), "-m", "sglang.bench_serving", "--backend", "sglang",
                            "--host", "127.0.0.1", "--port", str(port), "--model", model, "--tokenizer", model,
                            "--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
                            "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
                            "--num-prompts", str(serving.num_prompts(args, concurrency)),
                            "--max-concurrency", str(concurrency), "--output-file", str(out), "--disable-tqdm"],
                           # TPU_PLUGINS_DEVICE: the client imports SGLang's model configs too, which need
                           # the adapter's torchvision shim (sglang_tpu/torchvision_compat.py).
                           check=True, capture_output=True, text=True,
                           env={**os.environ, **serving.QUIET, "TPU_PLUGINS_DEVICE": "tpu"})
            r = json.loads(out.read_text().strip().splitlines()[-1])
            rows.append((concurrency, r["output_throughput"]))
            serving.print_row(concurrency, r)
    finally:
        serving.stop(server)
    recompiles = serving.recompiles_in_log(log)
    print(f"sglang_out_tok_s={rows[-1][1]:.2f} recompiles={recompiles}")


if __name__ == "__main__":
    main()
