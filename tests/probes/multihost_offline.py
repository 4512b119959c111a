"""Probe: one host of a multi-host slice, or the single-process peer it is compared with.
Generates through the core engine and prints one JSON document.

argv: model folder, tensor-parallel size. The hosts come from the TPU_PLUGINS_COORDINATOR /
NUM_HOSTS / HOST_ID settings (unset: one process); each process simulates its own chips with
TPU_PLUGINS_SIM_DEVICES.
"""

import json
import sys

from tpu_plugins import runtime
from tpu_plugins.engine import Engine, EngineConfig
from tpu_plugins.offline import GenerationParams, OfflineGenerator
from tpu_plugins.sampling import SamplingParams

PROMPTS = [[1, 504, 3458, 28, 308, 2114, 282], [1, 2, 3], [1, 9690, 42, 17, 260, 1730, 314, 5, 6, 7, 8, 9]]

model, tp = sys.argv[1], int(sys.argv[2])
engine = Engine(EngineConfig(model=model, dtype="float32", tensor_parallel_size=tp, max_model_len=256,
                             max_num_seqs=4, max_num_batched_tokens=32, num_pages=64, progress=False))
generator = OfflineGenerator(engine)
greedy = generator.generate(PROMPTS, GenerationParams(max_tokens=12, ignore_eos=True, prompt_logprobs=0))
seeded = generator.generate(PROMPTS, GenerationParams(SamplingParams(temperature=1.0, seed=7), max_tokens=8,
                                                      ignore_eos=True))
unseeded = generator.generate(PROMPTS[:1], GenerationParams(SamplingParams(temperature=1.0), max_tokens=8,
                                                            ignore_eos=True))
rt = runtime.current()
print(json.dumps({
    "hosts": rt.num_hosts, "local_devices": rt.num_devices, "global_devices": rt.num_global_devices,
    "describe": engine.describe(),
    "greedy": [c.token_ids for c in greedy],
    "prompt_logprobs": [c.prompt_logprobs[1:] for c in greedy],
    "seeded": [c.token_ids for c in seeded],
    "unseeded": unseeded[0].token_ids,
    "read_bytes": engine.load_stats.read_bytes, "checkpoint_bytes": engine.load_stats.checkpoint_bytes,
}))
