"""Unit aliases and converters: every quantity in simcore is SI (seconds, bytes, FLOP/s, bytes/s)."""

KIB = 1024
MIB = 1024**2
GIB = 1024**3
KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12

MS = 1e-3
US = 1e-6
NS = 1e-9


def s_from_ms(ms: float) -> float:
    return ms * MS


def ms_from_s(s: float) -> float:
    return s / MS


def bytes_per_s_from_gbps(gbps: float) -> float:
    """Gigabits per second -> bytes per second."""
    return gbps * 1e9 / 8


def bytes_per_s_from_gb_per_s(gb_per_s: float) -> float:
    """Gigabytes (1e9) per second -> bytes per second."""
    return gb_per_s * GB


def flops_from_tflops(tflops: float) -> float:
    return tflops * 1e12


DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_block": 1, "int8": 1, "int4": 0.5,
               "nvfp4": 0.5625}
"""Bytes per element by dtype name (block and group scales of quantized formats are a few
percent and left out, except nvfp4's fp8 scale per 16 elements)."""
