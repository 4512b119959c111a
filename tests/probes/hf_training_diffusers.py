"""Probe: an Accelerate training loop and a diffusers pipeline on "tpu" against the CPU.
Prints one JSON document. argv: a scratch folder. Run with TPU_PLUGINS_DEVICE=tpu."""

import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

scratch = Path(sys.argv[1])
out = {}

# Accelerate: the same loop (forward, backward, AdamW step) on the CPU and on "tpu".
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)
base = LlamaForCausalLM(config)
batches = [torch.randint(0, 128, (4, 16)) for _ in range(2)] * 4   # learnable: seen four times


def train(device: str):
    os.environ["ACCELERATE_TORCH_DEVICE"] = device   # Accelerate's own device switch
    AcceleratorState._reset_state(True)
    accelerator = Accelerator()
    model = copy.deepcopy(base)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for batch in batches:
        batch = batch.to(accelerator.device)
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"device": str(accelerator.device), "param_device": str(next(model.parameters()).device), "losses": losses}


out["training"] = {"cpu": train("cpu"), "tpu": train("tpu")}

# diffusers: a random-weight DDIM pipeline saved locally, loaded with device_map and moved with .to.
from diffusers import DDIMPipeline, DDIMScheduler, DiffusionPipeline, UNet2DModel  # noqa: E402

torch.manual_seed(0)
unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(32, 64),
                   down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                   norm_num_groups=8)
folder = scratch / "ddim"
DDIMPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100)).save_pretrained(folder)


def images(pipe):
    result = pipe(generator=torch.Generator().manual_seed(1), num_inference_steps=3, output_type="np").images
    return np.asarray(result)


reference = images(DiffusionPipeline.from_pretrained(folder))
moved = DiffusionPipeline.from_pretrained(folder).to("tpu")
mapped = DiffusionPipeline.from_pretrained(folder, device_map="tpu")
out["diffusers"] = {
    "moved_device": str(moved.device), "mapped_device": str(mapped.device),
    "moved_max_diff": float(np.abs(images(moved) - reference).max()),
    "mapped_max_diff": float(np.abs(images(mapped) - reference).max()),
    "image_range": [float(reference.min()), float(reference.max())], "shape": list(reference.shape),
}
json.dump(out, sys.stdout)
print()
