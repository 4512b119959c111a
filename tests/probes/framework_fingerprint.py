"""Prints what the host frameworks decide at import and start-up, as one JSON line.

Used to show that installing tpu-plugins changes nothing for programs that do not ask for a TPU.
"""

import json
import tempfile


def outcome(fn):
    try:
        value = fn()
        return value if isinstance(value, (str, bool, int)) else f"{type(value).__module__}.{type(value).__qualname__}"
    except Exception as exc:  # the frameworks' own failures are part of the fingerprint
        return f"error: {type(exc).__name__}"


import torch  # noqa: E402
import vllm  # noqa: E402,F401
import sglang  # noqa: E402,F401
import transformers  # noqa: E402


def vllm_platform():
    import vllm.platforms

    return vllm.platforms.current_platform


def sglang_platform():
    from sglang.srt.platforms import current_platform

    return current_platform


def trainer_device():
    with tempfile.TemporaryDirectory() as tmp:
        return str(transformers.TrainingArguments(output_dir=tmp).device)


print(json.dumps({
    "torch_privateuse1_name": torch._C._get_privateuse1_backend_name(),
    "torch_has_tpu_module": hasattr(torch, "tpu"),
    "torch_tpu_device_parses": outcome(lambda: str(torch.device("tpu"))),
    "vllm_platform": outcome(vllm_platform),
    "sglang_platform": outcome(sglang_platform),
    "trainer_device": outcome(trainer_device),
}))
