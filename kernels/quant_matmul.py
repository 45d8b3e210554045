"""quant_matmul: the one op every quantized Linear calls; dispatches by device, then by M.

    CPU            reference.quant_matmul_ref (the oracle)
    CUDA           triton/dispatch.py: GEMV / fused dequant GEMM / dequant + cuBLAS, chosen per
                   (bits, group, N, K, M-bucket) from kernels/configs/<gpu>.json (docs/kernels.md)

Triton is imported on the first CUDA call only, so the CPU path never needs it working.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from edgellm.kernels import reference
from edgellm.kernels.qweight import QuantizedWeight

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _cuda_backend() -> Callable[..., Tensor] | None:
    try:
        from edgellm.kernels.triton.dispatch import quant_matmul_triton
    except ImportError as e:  # triton missing on this platform
        logger.warning("quant_matmul: Triton unavailable (%s); CUDA tensors use the reference path", e)
        return None
    return quant_matmul_triton


def quant_matmul(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """y [..., N] = x[..., perm] @ W + bias for x [..., K]; fp32 accumulation, x's dtype out."""
    if x.device.type == "cuda":
        backend = _cuda_backend()
        if backend is not None:
            return backend(x, qw, bias)
    return reference.quant_matmul_ref(x, qw, bias)


def warmup(weights: Iterable[QuantizedWeight], m_buckets: Iterable[int] | None = None,
           dtype: torch.dtype = torch.float16, tune: bool = True) -> float:
    """Call once after loading, before CUDA-graph capture: tunes shapes missing from the GPU's
    dispatch table (saved under $EDGELLM_HOME/kernels/), compiles every chosen kernel, and
    returns the seconds it took. CPU weights: nothing to do, returns 0."""
    weights = [w for w in weights if w.device.type == "cuda"]
    if not weights or _cuda_backend() is None:
        return 0.0
    import time

    from edgellm.kernels.triton import table, tune as tuner

    start = time.perf_counter()
    tuner.warmup(weights, table.M_BUCKETS if m_buckets is None else m_buckets, dtype, tune=tune)
    elapsed = time.perf_counter() - start
    logger.info("quant_matmul warm-up: %d weights, %.1f s", len(weights), elapsed)
    return elapsed
