"""quant_matmul: the one op every quantized Linear calls; dispatches by device, then by M.

    CPU            reference.quant_matmul_ref (the oracle)
    CUDA           triton/dispatch.py: GEMV / fused dequant GEMM / dequant + cuBLAS, chosen per
                   (bits, group, N, K, M-bucket) from kernels/configs/<gpu>.json (docs/kernels.md)

Triton is imported on the first CUDA call only, so the CPU path never needs it working.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

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
