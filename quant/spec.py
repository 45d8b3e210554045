"""QuantSpec: what a checkpoint's quantization config says, after aliases are resolved."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class QuantMethod(str, Enum):
    GPTQ = "gptq"
    AWQ = "awq"
    COMPRESSED_TENSORS = "compressed-tensors"


@dataclass(frozen=True, slots=True)
class QuantSpec:
    method: QuantMethod
    bits: int  # as stored: 2, 3, 4 or 8
    group_size: int  # -1: one group over all of K
    sym: bool
    act_order: bool  # g_idx / weight_g_idx may be non-monotonic
    # GPTQ: "gptq" (v1, zeros stored minus one) or "gptq_v2". AWQ: "gemm" or "gemv".
    # compressed-tensors: "pack-quantized".
    format: str
    ignore: tuple[str, ...] = ()  # module names (or "re:" patterns) left unquantized
