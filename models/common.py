"""Device, precision and seeding helpers shared by every pipeline.

Precision names follow the API: ``auto | fp32 | fp16 | bf16``. ``auto`` means the fastest safe choice for the
device: half precision autocast on CUDA; on CPU, fp32, except for training code that opts in to bf16 on CPUs with
native bf16 (AVX512-BF16 or AMX). On AVX2-only CPUs bf16 autocast was measured about 20x slower than fp32. On CPUs
with native bf16 it is faster, but explanations keep fp32 by default: measured on NRMS-MiniLM at 64 Gauss-Legendre
steps, bf16 IG was 2.4x faster with a median completeness error of 1.8e-3 (max 7.5e-2) against 2e-6 in fp32, and
accuracy comes first there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch

Precision = Literal["auto", "fp32", "fp16", "bf16"]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def default_device() -> torch.device:
    """``cuda`` when available (``EXPLAINQ_DEVICE`` overrides), else ``cpu``."""
    forced = os.environ.get("EXPLAINQ_DEVICE")
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when the CPU executes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(
    precision: str, device: torch.device | str, cuda_half: str = "fp16", cpu_native_bf16: bool = False
) -> str:
    """Turn ``auto`` into a concrete precision for ``device``; validate the others.

    ``cuda_half`` is the half type ``auto`` picks on CUDA (``fp16`` for inference, ``bf16`` for training where
    the GPU supports it). ``cpu_native_bf16`` lets ``auto`` pick bf16 on CPUs that execute it natively (training
    loops, where it was measured faster); otherwise ``auto`` is fp32 on every CPU.
    """
    device = torch.device(device)
    if precision not in ("auto", *DTYPES):
        raise ValueError(f"precision must be one of auto, fp32, fp16, bf16, got {precision!r}")
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            # fp16 autocast on CPU exists but is slow and lossy; bf16 is the CPU half type.
            return "bf16"
        return precision
    if device.type == "cuda":
        if cuda_half == "bf16" and torch.cuda.is_bf16_supported():
            return "bf16"
        return "fp16"
    if device.type == "cpu" and cpu_native_bf16 and cpu_has_native_bf16():
        return "bf16"
    return "fp32"


@contextlib.contextmanager
def autocast(device: torch.device | str, precision: str) -> Iterator[None]:
    """Autocast for a resolved precision; a no-op for fp32."""
    device = torch.device(device)
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=DTYPES[precision]):
        yield


class NonFiniteError(ArithmeticError):
    """A computed score is NaN or infinite; ``items`` names what it belongs to (triples, sample ids, a step).

    The worker turns it into the job error ``non_finite_scores`` (``diverged`` for training), so a bad number
    fails loudly instead of vanishing from a ranking or a mean.
    """

    def __init__(self, message: str, items: list | None = None) -> None:
        super().__init__(message)
        self.items = list(items or [])


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch; optionally ask torch for deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        require_cublas_workspace()
        # strict: an operation without a deterministic kernel raises instead of warning and varying silently
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


CUBLAS_WORKSPACE = ":4096:8"


def require_cublas_workspace() -> None:
    """Deterministic cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` before CUDA creates its handles.

    Set it here when CUDA has not started in this process; when it has and the variable is missing, handles may
    already exist with the default workspace, so refuse rather than run non-deterministically. Set
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the worker's environment to make this hold in a long-lived worker.
    """
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") in (":4096:8", ":16:8"):
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError("deterministic mode on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before "
                           "CUDA starts; set it in the worker's environment")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
