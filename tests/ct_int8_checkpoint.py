"""Test helper: a compressed-tensors W8A16 (int8 weight-only, per-channel, symmetric)
checkpoint from a Hugging Face model folder, written by the compressed_tensors library's own
API, so the files are what llm-compressor produces, not what our loader expects.

Flow (same as llm-compressor's data-free QuantizationModifier + save):
  apply_quantization_config -> per-row min/max -> calculate_qparams -> weight_scale
  -> ModelCompressor.from_pretrained_model(...).compress_model -> save_pretrained
  -> compressor.update_config
"""
import torch
from torch import nn


class _UnfusedExpert(nn.Module):
    def __init__(self, gate_up, down, act_fn):
        super().__init__()
        inter, hidden = gate_up.shape[0] // 2, gate_up.shape[1]
        self.gate_proj = nn.Linear(hidden, inter, bias=False, dtype=gate_up.dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=False, dtype=gate_up.dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=False, dtype=down.dtype)
        self.gate_proj.weight.data.copy_(gate_up[:inter])
        self.up_proj.weight.data.copy_(gate_up[inter:])
        self.down_proj.weight.data.copy_(down)
        self.act_fn = act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _UnfusedExperts(nn.ModuleList):
    """Per-expert nn.Linear replacement for transformers-5 fused experts
    (gate_up_proj [E, 2I, D], down_proj [E, D, I]); state-dict names become
    experts.{e}.gate_proj/up_proj/down_proj, i.e. the checkpoint layout."""

    def __init__(self, fused):
        super().__init__(
            _UnfusedExpert(fused.gate_up_proj.data[e], fused.down_proj.data[e], fused.act_fn)
            for e in range(fused.gate_up_proj.shape[0])
        )

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e, expert in enumerate(self):
            tok, k = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            y = expert(hidden_states[tok]) * top_k_weights[tok, k, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def _unfuse_moe_experts(model) -> int:
    n = 0
    for name, mod in list(model.named_modules()):
        gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
        if not (isinstance(gu, nn.Parameter) and isinstance(dn, nn.Parameter) and gu.ndim == 3):
            continue
        if getattr(mod, "is_transposed", False) or getattr(mod, "has_bias", False):
            raise NotImplementedError(f"unsupported fused expert layout in {name}")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _UnfusedExperts(mod))
        n += 1
    return n


def write_int8_checkpoint(src_folder, out_folder, fmt="pack-quantized", unfuse_experts=True) -> None:
    """W8A16: int8 symmetric per-output-channel weights for every nn.Linear except
    lm_head (and an nn.Linear MoE router `mlp.gate`, if any); embeddings/norms stay float.
    fmt: "pack-quantized" (int32 weight_packed + weight_shape + weight_scale) or
    "int-quantized" (int8 weight + weight_scale)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.offload import update_offload_parameter
    from compressed_tensors.quantization import (
        QuantizationArgs, QuantizationConfig, QuantizationScheme, QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    assert fmt in ("pack-quantized", "int-quantized"), fmt
    model = AutoModelForCausalLM.from_pretrained(src_folder, dtype="auto")
    # compressed_tensors only quantizes nn.Linear/nn.Embedding: fused 3-D experts must be
    # split into per-expert nn.Linear first (as llm-compressor's MoE calibration modules do).
    if unfuse_experts:
        _unfuse_moe_experts(model)

    w8 = QuantizationArgs(num_bits=8, type="int", strategy="channel", symmetric=True, dynamic=False)
    scheme = QuantizationScheme(targets=["Linear"], weights=w8, format=fmt)
    ignore = ["lm_head"] + (["re:.*mlp\\.gate$"] if any(n.endswith("mlp.gate") for n, _ in model.named_modules()) else [])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore))

    # data-free calibration: per-row min/max (= llm-compressor's memoryless_minmax observer
    # for weights) -> library helper calculate_qparams -> scale = absmax / 127.5
    for module in model.modules():
        sch = getattr(module, "quantization_scheme", None)
        if sch is None or sch.weights is None:
            continue
        w = module.weight
        scale, zp = calculate_qparams(w.amin(-1, keepdim=True), w.amax(-1, keepdim=True), sch.weights)
        update_offload_parameter(module, "weight_scale", scale.to(module.weight_scale.dtype))
        update_offload_parameter(module, "weight_zero_point", zp.to(module.weight_zero_point.dtype))
        module.quantization_status = QuantizationStatus.FROZEN

    compressor = ModelCompressor.from_pretrained_model(model)  # format taken from scheme.format
    compressor.compress_model(model)  # quantize + pack, drops symmetric zero points
    model.save_pretrained(out_folder)  # transformers reverts fused-name conversions on save
    compressor.update_config(out_folder)  # writes quantization_config into config.json
