"""Run every benchmark and write bench/RESULTS.md with its plot, bench/results.png. One command:

    .venv/bin/python bench/report.py

CPU benchmarks (the JAX CPU backend standing in for the TPU, each against its peer in the same
script): engine vs transformers (engine_throughput.py), vLLM serving (vllm_serving.py), SGLang
serving (sglang_serving.py), transformers generate on "tpu" vs torch CPU (hf_generate.py), int8
vs bf16 weights (int8_weights.py) and mixture of experts (moe.py; both also compile TPU slices
ahead of time).
`--only SCRIPT ...` reruns some and takes the others' figures from their logs.
TPU estimates: `tpu-plugins aot` for the shipped configs on v5e, v6e and v7 slices
(aot_configs.py). Each benchmark's output is kept in bench/logs/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOGS = HERE / "logs"
CPU_BENCHMARKS = {   # script -> what it compares
    "engine_throughput.py": "core engine vs transformers generate, offline, same prompts",
    "vllm_serving.py": "vllm serve --device tpu under vllm bench serve",
    "sglang_serving.py": "sglang.launch_server --device tpu under sglang.bench_serving",
    "hf_generate.py": "transformers generate on device_map='tpu' vs on CPU",
    "int8_weights.py": "int8 vs bf16 weights: SmolLM2 accuracy and CPU decode, Llama-3.1-8B HBM on v5e/v6e (aot)",
    "moe.py": "MoE engine vs transformers generate (random Qwen3-MoE), Qwen3-30B-A3B / Mixtral-8x7B on v6e (aot)",
    "multihost.py": "two simulated hosts vs one process on the same 4-chip mesh; Llama-3.1-70B on multi-host slices (aot)",
}
WHOLE_OUTPUT = {"int8_weights.py", "moe.py", "multihost.py"}   # their whole output is the result table


def last_line_values(text: str) -> dict:
    lines = [line for line in text.strip().splitlines() if "=" in line]
    return {k: _number(v) for k, v in re.findall(r"(\w+)=(\S+)", lines[-1])} if lines else {}


def _number(text: str):
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def run(script: str, *args: str) -> str:
    print(f"== {script} {' '.join(args)}", flush=True)
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    (LOGS / f"{Path(script).stem}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr[-20000:])
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed (exit {proc.returncode}); see {LOGS / Path(script).stem}.log")
    print(proc.stdout.strip().splitlines()[-1], flush=True)
    return proc.stdout


def logged_stdout(script: str) -> str | None:
    """The stdout an earlier run of `script` left in bench/logs/, if any."""
    log = LOGS / f"{Path(script).stem}.log"
    return log.read_text().split("\n--- stderr ---\n")[0] if log.exists() else None


def table_lines(text: str) -> list[str]:
    """A benchmark's own result table: the lines from its header row to its last line."""
    lines = text.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("batch ")), None)
    return lines[start:] if start is not None else []


def serving_rows(text: str) -> list[dict]:
    pattern = re.compile(r"concurrency\s+(\d+):\s+([\d.]+) out tok/s\s+TTFT median\s+([\d.]+) ms p99\s+([\d.]+) ms"
                         r"\s+TPOT median\s+([\d.]+) ms p99\s+([\d.]+) ms")
    return [dict(zip(("concurrency", "out_tok_s", "ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms"),
                     (int(m[0]), *map(float, m[1:])))) for m in pattern.findall(text)]


def plot(cpu: dict, aot: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [1, 2.6]})
    labels, values = [], []
    engine = cpu.get("engine_throughput.py")
    if engine:
        labels.append("engine /\ntransformers")
        values.append(engine["ratio"])
    vllm = cpu.get("vllm_serving.py")
    if engine and vllm:
        labels.append("vLLM serving c32 /\nengine offline")
        values.append(vllm["vllm_out_tok_s"] / engine["engine_tok_s"])
    sglang = cpu.get("sglang_serving.py")
    if engine and sglang:
        labels.append("SGLang serving c32 /\nengine offline")
        values.append(sglang["sglang_out_tok_s"] / engine["engine_tok_s"])
    hf = cpu.get("hf_generate.py")
    if hf:
        labels.append("HF generate tpu /\ntorch CPU")
        values.append(hf["ratio"])
    left.bar(labels, values, color=["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"][: len(values)])
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    for i, v in enumerate(values):
        left.text(i, v, f"{v:.2f}", ha="center", va="bottom")
    left.set_title("(a) CPU throughput ratios (same run)")
    left.set_ylabel("ratio")

    cases = [r for r in aot if "anchor" not in r and r["est_decode_step_s"]]
    names = [f"{Path(r['model']).stem}\n{r['topology']}" for r in cases]
    x = range(len(cases))
    right.bar([i - 0.2 for i in x], [r["est_decode_step_s"] * 1e3 for r in cases], 0.4, label="estimate (compiled program)")
    right.bar([i + 0.2 for i in x], [r["roofline_decode_step_s"] * 1e3 for r in cases], 0.4, label="roofline")
    for i, r in zip(x, cases):
        right.text(i, r["est_decode_step_s"] * 1e3, f"{r['est_to_roofline']:.2f}x", ha="center", va="bottom", fontsize=7)
    right.set_xticks(list(x), names, rotation=70, fontsize=7)
    right.set_yscale("log")
    right.set_ylabel("decode step, ms (16 sequences x 2048 tokens)")
    right.set_title("(b) AOT decode step: estimate vs roofline, per model and slice")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(cpu: dict, serving: dict, tables: dict, aot: list[dict], path: Path,
                   only: list[str] | None = None) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Benchmark results",
        "",
        f"Generated by `.venv/bin/python bench/report.py` on {now}; machine: {platform.machine()}, "
        f"{_cpu_count()} CPU cores, no TPU. CPU figures are noisy: compare the ratios within one run. "
        "Logs of this run: `bench/logs/`.",
        *([f"This report reran only {', '.join(only)}; the other CPU rows are from the logs of an earlier run."]
          if only else []),
        "",
        "![results](results.png)",
        "",
        "## CPU: the JAX CPU backend standing in for the TPU (demo model, SmolLM2-135M, float32)",
        "",
        "| benchmark | compares | result |",
        "|---|---|---|",
    ]
    for script, what in CPU_BENCHMARKS.items():
        values = cpu.get(script)
        result = ", ".join(f"{k}={v}" for k, v in values.items()) if values else "not built yet (its adapter issue is open)"
        out.append(f"| `{script}` | {what} | {result} |")
    for script, text in tables.items():
        if text:
            out += ["", f"`{script}`:", "", "```", *text, "```"]
    for script, rows in serving.items():
        if rows:
            out += ["", f"`{script}` per concurrency:", "",
                    "| concurrency | out tok/s | TTFT median ms | TTFT p99 ms | TPOT median ms | TPOT p99 ms |",
                    "|---|---|---|---|---|---|"]
            out += [f"| {r['concurrency']} | {r['out_tok_s']:.1f} | {r['ttft_median_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
                    f"{r['tpot_median_ms']:.0f} | {r['tpot_p99_ms']:.0f} |" for r in rows]
    out += [
        "",
        "## TPU, ahead of time: `tpu-plugins aot` (libtpu compiles the engine's real steps for the slice)",
        "",
        "bf16, 16 sequences, decode measured with every sequence at 2048 tokens, TP over every device of the "
        "slice. *Estimate*: HBM bytes the compiled program moves (read from XLA's optimized HLO) plus what the "
        "Pallas kernels must move, against HBM bandwidth; flops against peak; plus the all-reduces over ICI. "
        "*Roofline*: every weight and every cached K/V read once. See `tpu_plugins/aot.py` and "
        "`tpu_plugins/hlo_traffic.py` for why XLA's own `bytes accessed` is not used (it double-counts "
        "weights prefetched into VMEM and charges Pallas calls their whole aliased cache); it is listed for "
        "reference.",
        "",
        "| model | slice | TP | fits | HBM/chip GiB (of) | largest KV, tokens | est. step ms | roofline ms | est/roofline "
        "| est. tok/s | XLA bytes-accessed step ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in aot:
        est = r["est_decode_step_s"]
        xla = r.get("xla_cost_analysis_decode", {}).get("step_s_from_bytes_accessed")
        label = f"{Path(r['model']).stem}" + (f" (anchor shape, {r['max_model_len']} ctx)" if "anchor" in r else "")
        out.append(
            f"| {label} | {r['topology']} | {r['tensor_parallel_size']} | {'yes' if r['fits'] else 'no'} | "
            f"{r['hbm_bytes_per_chip'] / 2**30:.2f} ({r['hbm_capacity_per_chip'] / 2**30:.0f}) | {r['kv_cache_tokens']} | "
            + (f"{est * 1e3:.3f} | {r['roofline_decode_step_s'] * 1e3:.3f} | {r['est_to_roofline']:.3f} | "
               f"{r['est_decode_tokens_per_s']:.0f} | {xla * 1e3:.3f} |" if est else "- | - | - | - | - |"))
    anchor = next((r for r in aot if "anchor" in r), None)
    if anchor:
        a = anchor["anchor"]
        out += ["", f"**Published anchor**: {a['source']}: TPOT {a['published_tpot_ms']} ms. Our estimate for the same "
                f"model, slice and TP with 16 sequences at up to {a['max_model_len']} tokens of context: "
                f"{anchor['est_decode_step_s'] * 1e3:.2f} ms per decode step (roofline "
                f"{anchor['roofline_decode_step_s'] * 1e3:.2f} ms). The estimate is the device step alone: it leaves "
                "out sampling, the host's scheduling between steps and kernel launch and DMA latencies, which a "
                "measured TPOT includes, so it is a lower bound for our TPOT on that slice, not a prediction of it."]
    target = next((r for r in aot if "anchor" not in r and r["model"].endswith("Llama-3.1-8B.json")
                   and r["topology"] == "v6e:2x2"), None)
    if target:
        out += ["", f"**Target** (Llama-3.1-8B, v6e:2x2, TP=4, 16 sequences, 2k context): estimated decode step "
                f"{target['est_to_roofline']:.3f}x the roofline (goal: within 1.25x)."]
    path.write_text("\n".join(out) + "\n")


def _cpu_count() -> int:
    import os
    return len(os.sched_getaffinity(0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-cpu", action="store_true", help="only the AOT estimates (about 15 minutes)")
    parser.add_argument("--reuse-aot", action="store_true",
                        help="keep bench/logs/aot_configs.json from an earlier run instead of recompiling")
    parser.add_argument("--only", nargs="+", metavar="SCRIPT",
                        help="run only these CPU benchmarks; the others' figures come from their logs in bench/logs/")
    args = parser.parse_args()
    LOGS.mkdir(exist_ok=True)

    cpu, serving, tables = {}, {}, {}
    if not args.skip_cpu:
        for script in CPU_BENCHMARKS:
            if not (HERE / script).exists():
                continue
            text = run(script) if not args.only or script in args.only else logged_stdout(script)
            if text:
                cpu[script] = last_line_values(text)
                serving[script] = serving_rows(text)
                tables[script] = text.strip().splitlines() if script in WHOLE_OUTPUT else table_lines(text)
    aot_json = LOGS / "aot_configs.json"
    if not (args.reuse_aot and aot_json.exists()):
        run("aot_configs.py", "--json", str(aot_json))
    aot = json.loads(aot_json.read_text())
    plot(cpu, aot, HERE / "results.png")
    write_markdown(cpu, serving, tables, aot, HERE / "RESULTS.md", args.only)
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'results.png'}")


if __name__ == "__main__":
    main()
