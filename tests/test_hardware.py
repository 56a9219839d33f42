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


NEW_GPUS = ("GH200-96GB", "GH200-144GB", "H800", "A800-80GB", "L4", "B300", "GB200", "MI325X",
            "MI355X")


def test_added_gpus_load_with_sources_and_expected_fp8():
    catalog = gpu_catalog()
    for name in NEW_GPUS:
        spec = catalog[name]
        assert spec.source.startswith("https://")
        assert spec.bf16_flops > 1e14 and spec.hbm_bandwidth_bytes_per_s >= 3e11
        assert spec.interconnect_bandwidth_bytes_per_s > 0 and spec.gpus_per_node >= 1
        assert spec.has_fp8 == (name != "A800-80GB")
        if spec.has_fp8:
            assert spec.fp8_flops == pytest.approx(2 * spec.bf16_flops, rel=5e-3)  # L4: 485/242
    a800 = get_gpu("A800-80GB")
    assert a800.flops_for("fp8") == a800.bf16_flops == get_gpu("A100-80GB").bf16_flops


def test_added_gpus_memory_is_the_driver_reported_total():
    mib = 2**20
    assert get_gpu("L4").memory_bytes == 23034 * mib                 # ~22.5 GiB of "24 GB"
    assert 22 * 2**30 < get_gpu("L4").memory_bytes < 24 * 2**30
    assert get_gpu("GH200-96GB").memory_bytes == 97871 * mib
    assert get_gpu("H800").memory_bytes == get_gpu("H100-SXM").memory_bytes
    assert get_gpu("A800-80GB").memory_bytes == get_gpu("A100-80GB").memory_bytes
    assert get_gpu("B300").memory_bytes == 275040 * mib
    assert get_gpu("GB200").memory_bytes == 189471 * mib
    # Each is below its HBM's physical capacity (binary GiB), and capacities order as the parts do.
    for name, stacks_gib in (("GH200-96GB", 96), ("GH200-144GB", 144), ("B300", 288),
                             ("GB200", 192), ("MI325X", 256), ("MI355X", 288)):
        assert 0.9 * stacks_gib * 2**30 < get_gpu(name).memory_bytes < stacks_gib * 2**30
    assert (get_gpu("MI355X").memory_bytes > get_gpu("B300").memory_bytes
            > get_gpu("MI325X").memory_bytes > get_gpu("GB200").memory_bytes
            > get_gpu("B200").memory_bytes > get_gpu("GH200-144GB").memory_bytes
            > get_gpu("H200").memory_bytes > get_gpu("GH200-96GB").memory_bytes
            > get_gpu("H100-SXM").memory_bytes)


def test_added_gpus_bandwidth_ordering():
    bw = {name: spec.hbm_bandwidth_bytes_per_s for name, spec in gpu_catalog().items()}
    assert bw["GB200"] == bw["B200"] > bw["B300"] > bw["H200"] > bw["H100-SXM"]  # B300: 7.75 TB/s
    assert bw["GH200-144GB"] > bw["H200"] and bw["H100-SXM"] < bw["GH200-96GB"] < bw["H200"]
    assert bw["MI355X"] > bw["MI325X"] > bw["MI300X"]
    assert bw["H800"] == bw["H100-SXM"] and bw["A800-80GB"] == bw["A100-80GB"]
    assert bw["L4"] == pytest.approx(300e9) and bw["L4"] < bw["L40S"]


def test_added_gpus_interconnect_and_node_size():
    ic = {name: spec.interconnect_bandwidth_bytes_per_s for name, spec in gpu_catalog().items()}
    assert ic["H800"] == pytest.approx(200e9) and ic["H800"] < ic["H100-SXM"]  # 400 both ways
    assert ic["A800-80GB"] == pytest.approx(200e9) and ic["A800-80GB"] < ic["A100-80GB"]
    assert ic["B300"] == ic["GB200"] == ic["B200"] == 900e9
    assert ic["L4"] == pytest.approx(32e9)                             # PCIe Gen4 x16
    assert ic["MI355X"] > ic["MI325X"] == ic["MI300X"]
    assert get_gpu("GB200").gpus_per_node == 72                        # the NVL72 NVLink domain
    assert get_gpu("GH200-96GB").gpus_per_node == 1 and get_gpu("GH200-144GB").gpus_per_node == 2
    assert HardwareConfig(gpu="GB200", gpus_per_node=4).resolve().gpus_per_node == 4


def test_added_gpus_dense_peaks():
    assert get_gpu("L4").bf16_flops == pytest.approx(121e12)           # 242 with sparsity
    assert get_gpu("L4").fp8_flops == pytest.approx(242.5e12)          # 485 with sparsity
    assert get_gpu("B300").fp8_flops == pytest.approx(4.5e15)
    assert get_gpu("GB200").bf16_flops == pytest.approx(2.5e15)
    assert get_gpu("H800").bf16_flops == get_gpu("H100-SXM").bf16_flops
    assert get_gpu("MI325X").fp8_flops == get_gpu("MI300X").fp8_flops
    assert get_gpu("MI355X").fp8_flops == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)


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
