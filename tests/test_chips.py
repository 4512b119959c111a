import pytest

from tpu_plugins import chips
from tpu_plugins.errors import UserError


def test_table_covers_the_generations_we_target():
    assert set(chips.CHIPS) == {"v4", "v5e", "v5p", "v6e", "v7"}


@pytest.mark.parametrize("kind,generation", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v6 lite", "v6e"), ("TPU7x", "v7"),
])
def test_jax_device_kind_maps_to_generation(kind, generation):
    assert chips.chip_for_device_kind(kind).generation == generation


def test_unknown_device_kind_is_none_and_unknown_name_is_a_clear_error():
    assert chips.chip_for_device_kind("cpu") is None
    with pytest.raises(UserError, match="known generations: v4, v5e, v5p, v6e, v7"):
        chips.chip_by_name("v9z")


def test_published_figures_are_consistent():
    v6e = chips.chip_by_name("v6e")
    assert v6e.bf16_flops_per_s == 918e12
    assert v6e.hbm_bytes == 32 * 2**30 and v6e.hbm_bytes_per_s == 1640e9
    # Later generations are faster per chip; 8-bit throughput is never below bf16.
    order = ["v5e", "v6e", "v7"]
    assert [chips.CHIPS[g].bf16_tflops for g in order] == sorted(chips.CHIPS[g].bf16_tflops for g in order)
    for spec in chips.CHIPS.values():
        assert spec.int8_tops >= spec.bf16_tflops
        assert spec.hbm_bytes_per_device * spec.devices_per_chip == spec.hbm_bytes
