"""The GPU catalog and the hardware config that selects and overrides an entry."""

import pytest
from pydantic import ValidationError

from simcore.errors import ConfigError
from simcore.hardware import HardwareConfig, get_gpu, gpu_catalog


def test_catalog_has_the_common_datacenter_gpus_with_sources():
    catalog = gpu_catalog()
    for name in ("A100-80GB", "A100-40GB", "H100-SXM", "H100-PCIe", "H200", "B200", "MI300X",
                 "L40S", "A40"):
        spec = catalog[name]
        assert spec.source.startswith("https://")
        assert spec.bf16_flops > 1e14 and spec.hbm_bandwidth_bytes_per_s > 5e11
        assert spec.memory_bytes > 40e9 and spec.gpus_per_node == 8
        assert spec.interconnect_bandwidth_bytes_per_s > 0


def test_datasheet_values_are_dense_peaks():
    h100 = get_gpu("H100-SXM")
    assert h100.bf16_flops == pytest.approx(989.4e12)      # 1979 with 2:4 sparsity
    assert h100.fp8_flops == pytest.approx(1978.9e12)
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.interconnect_bandwidth_bytes_per_s == pytest.approx(450e9)  # 900 GB/s both ways
    assert get_gpu("B200").bf16_flops == pytest.approx(2.25e15)
    assert get_gpu("MI300X").memory_bytes == 205_822_885_888


def test_fp8_without_fp8_tensor_cores_runs_at_bf16_rate():
    a100 = get_gpu("A100-80GB")
    assert not a100.has_fp8 and a100.fp8_flops is None
    assert a100.flops_for("fp8") == a100.bf16_flops
    assert get_gpu("H100-SXM").flops_for("fp8") == get_gpu("H100-SXM").fp8_flops


def test_lookup_is_case_insensitive_and_unknown_lists_known():
    assert get_gpu("h100-sxm").name == "H100-SXM"
    with pytest.raises(ConfigError, match="unknown GPU 'V100'.*H100-SXM.*MI300X"):
        get_gpu("V100")


def test_hardware_config_overrides_and_validation():
    spec = HardwareConfig(gpu="H100-SXM", hbm_bandwidth_bytes_per_s=3.0e12,
                          gpus_per_node=4).resolve()
    assert spec.hbm_bandwidth_bytes_per_s == 3.0e12 and spec.gpus_per_node == 4
    assert spec.bf16_flops == get_gpu("H100-SXM").bf16_flops
    with pytest.raises(ValidationError, match="unknown GPU"):
        HardwareConfig(gpu="TPU-v5")
    with pytest.raises(ValidationError):
        HardwareConfig(gpu="H100-SXM", memory_bytes=-1)
    with pytest.raises(ValidationError):
        HardwareConfig(gpu="H100-SXM", clock_mhz=1)
