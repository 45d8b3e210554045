"""QuantizedWeight: the one internal form of a quantized Linear weight.

Every checkpoint format (GPTQ, AWQ, compressed-tensors) is converted into this at
load time by `edgellm.quant.formats`; every kernel consumes only this.

    qweight  int32 [ceil(K * bits / 32), N]   codes packed along K, low bits first:
             code k of column n is field (k % pf) of word (k // pf), pf = 32 // bits.
             The last word of a column is zero-padded when K % pf != 0.
    scales   fp16 | bf16 [G, N]               G = ceil(K / group_size), checkpoint dtype
    zeros    same as scales, or None          true zero point; None means 2^(bits-1)
    perm     int32 [K] or None                act-order: y = x[:, perm] @ W

    W[k, n] = (q[k, n] - zeros[k // group_size, n]) * scales[k // group_size, n]   # [K, N]
    y       = x[:, perm] @ W + bias

W is the transpose of an HF Linear's [N, K] weight. The last group may be partial
(K % group_size != 0). 3-bit checkpoints are widened to bits=4 containers at load and
then always carry explicit zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SUPPORTED_BITS = (2, 4, 8)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _describe(t: Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    qweight: Tensor  # int32 [ceil(K * bits / 32), N]
    scales: Tensor  # [G, N]
    zeros: Tensor | None  # [G, N], same dtype as scales
    bits: int
    group_size: int  # K itself for one group per column
    perm: Tensor | None  # int32 [K]
    in_features: int  # K

    def __post_init__(self) -> None:
        K, N = self.in_features, self.out_features
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"QuantizedWeight.bits: expected one of {SUPPORTED_BITS}, got {self.bits}")
        if not 0 < self.group_size <= K:
            raise ValueError(f"QuantizedWeight.group_size: expected 1..{K} (K), got {self.group_size}")
        rows = -(-K * self.bits // 32)
        if self.qweight.dtype != torch.int32 or self.qweight.dim() != 2 or self.qweight.shape[0] != rows:
            raise ValueError(f"QuantizedWeight.qweight: expected [{rows}, N] int32, got {_describe(self.qweight)}")
        G = self.num_groups
        if self.scales.dtype not in SCALE_DTYPES or tuple(self.scales.shape) != (G, N):
            raise ValueError(f"QuantizedWeight.scales: expected [{G}, {N}] float16/bfloat16, got {_describe(self.scales)}")
        if self.zeros is not None and (self.zeros.dtype != self.scales.dtype or self.zeros.shape != self.scales.shape):
            raise ValueError(
                f"QuantizedWeight.zeros: expected [{G}, {N}] {str(self.scales.dtype).removeprefix('torch.')}, "
                f"got {_describe(self.zeros)}"
            )
        if self.perm is not None and (self.perm.dtype != torch.int32 or tuple(self.perm.shape) != (K,)):
            raise ValueError(f"QuantizedWeight.perm: expected [{K}] int32, got {_describe(self.perm)}")

    @property
    def out_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def num_groups(self) -> int:
        return -(-self.in_features // self.group_size)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def to(self, device: torch.device | str) -> QuantizedWeight:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return QuantizedWeight(
            qweight=self.qweight.to(device),
            scales=self.scales.to(device),
            zeros=move(self.zeros),
            bits=self.bits,
            group_size=self.group_size,
            perm=move(self.perm),
            in_features=self.in_features,
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros, self.perm) if t is not None)
