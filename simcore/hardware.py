"""GPU specifications: the datasheet catalog (data/gpus.yaml) and the config that picks one."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simcore.errors import ConfigError
from simcore.loading import parse_yaml
from simcore.units import GB, MIB, flops_from_tflops


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model's datasheet peaks, immutable; no achievable-efficiency factor is applied here.

    Compute models scale these peaks by their own declared efficiency factors. A GPU without fp8
    tensor cores (`fp8_flops` None, e.g. A100) still serves fp8 checkpoints the way vLLM does
    there: weight-only fp8 (Marlin kernels), so weights take 1 byte but GEMMs run at the bf16 rate
    (`flops_for("fp8")` returns `bf16_flops`).
    """

    name: str
    """Catalog name, e.g. "H100-SXM"."""
    bf16_flops: float
    """Dense bf16/fp16 tensor-core peak, FLOP/s."""
    fp8_flops: float | None
    """Dense fp8 tensor-core peak, FLOP/s; None when the GPU has no fp8 tensor cores."""
    memory_bytes: int
    """Device memory as CUDA reports it (what vLLM scales by gpu_memory_utilization) where a vLLM
    log shows it, else the driver's total (`simcore/data/gpus.yaml`)."""
    hbm_bandwidth_bytes_per_s: float
    """Peak device-memory bandwidth."""
    interconnect_bandwidth_bytes_per_s: float
    """Intra-node GPU-to-GPU bandwidth per GPU, one direction (NVLink / Infinity Fabric / PCIe)."""
    interconnect: str
    """The intra-node interconnect, in words."""
    gpus_per_node: int
    """GPUs sharing one intra-node interconnect domain."""
    source: str
    """Datasheet the numbers come from."""
    fp4_flops: float | None = None
    """Dense FP4 (NVFP4) tensor-core peak, FLOP/s; None when the GPU has no FP4 tensor cores
    (vLLM then runs NVFP4 weights weight-only, at the bf16 rate)."""

    @property
    def has_fp8(self) -> bool:
        """The GPU has fp8 tensor cores."""
        return self.fp8_flops is not None

    def flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s of GEMMs with weights in `dtype` (fp8 and nvfp4 fall back to bf16
        on a GPU without such tensor cores)."""
        if dtype.startswith("fp8") and self.fp8_flops is not None:
            return self.fp8_flops
        if dtype == "nvfp4" and self.fp4_flops is not None:
            return self.fp4_flops
        return self.bf16_flops


def _spec_from_entry(name: str, entry: Mapping[str, Any]) -> GpuSpec:
    """Convert one catalog entry (units in key names) to a GpuSpec."""
    try:
        fp8 = entry["fp8_tflops"]
        fp4 = entry.get("fp4_tflops")
        return GpuSpec(
            name=name,
            bf16_flops=flops_from_tflops(float(entry["bf16_tflops"])),
            fp8_flops=None if fp8 is None else flops_from_tflops(float(fp8)),
            memory_bytes=int(entry["memory_mib"]) * MIB,
            hbm_bandwidth_bytes_per_s=float(entry["hbm_bandwidth_gb_per_s"]) * GB,
            interconnect_bandwidth_bytes_per_s=float(entry["interconnect_gb_per_s"]) * GB,
            interconnect=str(entry["interconnect"]),
            gpus_per_node=int(entry["gpus_per_node"]),
            source=str(entry["source"]),
            fp4_flops=None if fp4 is None else flops_from_tflops(float(fp4)),
        )
    except KeyError as e:
        raise ConfigError(f"gpus.yaml: entry {name!r} lacks key {e.args[0]!r}") from None


@lru_cache(maxsize=1)
def gpu_catalog() -> Mapping[str, GpuSpec]:
    """All catalog GPUs by name (read once; the specs are immutable)."""
    text = (resources.files("simcore") / "data" / "gpus.yaml").read_text(encoding="utf-8")
    entries = parse_yaml(text, "gpus.yaml")
    return MappingProxyType({name: _spec_from_entry(name, e) for name, e in entries.items()})


def get_gpu(name: str) -> GpuSpec:
    """The catalog GPU called `name` (case-insensitive); ConfigError listing the known ones."""
    catalog = gpu_catalog()
    for known, spec in catalog.items():
        if known.lower() == name.lower():
            return spec
    raise ConfigError(f"unknown GPU {name!r}; known GPUs: {', '.join(catalog)}")


class HardwareConfig(BaseModel):
    """The GPU every engine runs on: a catalog entry, with any datasheet number overridden."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str = Field(description="GPU name from the catalog (simcore/data/gpus.yaml), e.g. "
                                 "'H100-SXM', 'A100-80GB', 'H200', 'B200', 'MI300X'.")
    gpus_per_node: int | None = Field(
        default=None, gt=0,
        description="GPUs per node sharing the intra-node interconnect; default: the catalog's.")
    bf16_flops: float | None = Field(
        default=None, gt=0, description="Override: dense bf16 peak, FLOP/s.")
    fp8_flops: float | None = Field(
        default=None, gt=0, description="Override: dense fp8 peak, FLOP/s.")
    fp4_flops: float | None = Field(
        default=None, gt=0, description="Override: dense FP4 (NVFP4) peak, FLOP/s.")
    memory_bytes: int | None = Field(
        default=None, gt=0, description="Override: device memory reported as total, bytes.")
    hbm_bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0, description="Override: peak device-memory bandwidth, bytes/s.")
    interconnect_bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0,
        description="Override: intra-node GPU-to-GPU bandwidth per GPU, one direction, bytes/s.")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        get_gpu(gpu)
        return gpu

    def resolve(self) -> GpuSpec:
        """The catalog spec with this config's overrides applied."""
        overrides = {k: v for k, v in self.model_dump(exclude={"gpu"}).items() if v is not None}
        return dataclasses.replace(get_gpu(self.gpu), **overrides)
