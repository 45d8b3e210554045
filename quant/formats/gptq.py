"""GPTQ (AutoGPTQ 0.7.1, GPTQModel) <-> QuantizedWeight.

Tensors of one Linear (K = in_features, N = out_features, b = bits, G = ceil(K / gs)):

    qweight int32 [ceil(K*b/32), N]   codes packed along K (dim 0), bit stream, LSB first
    qzeros  int32 [G, ceil(N*b/32)]   zero points packed along N (dim 1), same bit stream
    scales  fp16|bf16 [G, N]
    g_idx   int32 [K]                 group of every natural input row (act-order: not monotonic)

    qweight column n, b = 4:           qweight column n, b = 3 (32 rows -> 3 words):
    word r: |k=8r|8r+1|...|8r+7|       |k0..k9|k10 lo| |k10 hi|k11..k20|k21 lo| |k21 hi|k22..k31|
            bit 0            31        word 3r         word 3r+1               word 3r+2

Zero points: format "gptq" (v1, all AutoGPTQ output) stores z - 1, "gptq_v2" stores z.
v1 is decoded like GPTQModel's own loader: for b in {2, 4, 8} a constant with a 1 in every
field (0x55555555, 0x11111111, 0x01010101) is added to the whole word mod 2^32, which also
undoes the borrow GPTQModel's writer makes when a true zero is 0 (formats.md T2); for b = 3
each field gets +1 mod 8. Symmetric checkpoints still store qzeros; they must equal the
implicit 2^(b-1) and become `zeros=None` (b = 3: explicit 4s, see below).

Act-order: perm = stable argsort(g_idx); the K code rows are reordered by perm so that sorted
row i belongs to group i // gs, and perm is kept for the activations (y = x[:, perm] @ W).
3-bit is widened to 4-bit containers with explicit zeros (QuantizedWeight has no 3-bit form).
Scales stay in the checkpoint's dtype; zeros take the same dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import pack_codes
from edgellm.quant.formats.bitpack import (
    FLOAT_DTYPES,
    check_container,
    check_keys,
    check_tensor,
    dense_words,
    group_index,
    integer_zeros,
    internal_group_size,
    natural_codes,
    pack_dense,
    sort_by_group,
    to_int32,
    to_unsigned,
    unpack_dense,
)
from edgellm.quant.spec import QuantMethod, QuantSpec

BITS = (2, 3, 4, 8)
FORMATS = ("gptq", "gptq_v2")


def _field_ones(bits: int) -> int:
    """0x55555555 / 0x11111111 / 0x01010101: a 1 in every b-bit field of a word."""
    return sum(1 << (j * bits) for j in range(32 // bits))


def _check_spec(where: str, spec: QuantSpec) -> None:
    if spec.method != QuantMethod.GPTQ:
        raise ValueError(f"{where}: GPTQ converter called for quant method {spec.method.value!r}")
    if spec.format not in FORMATS:
        raise ValueError(f"{where}: GPTQ checkpoint format expected one of {list(FORMATS)}, got {spec.format!r}")
    if spec.bits not in BITS:
        raise ValueError(f"{where}: GPTQ bits expected one of {list(BITS)}, got {spec.bits}")


def _container_bits(bits: int) -> int:
    return 4 if bits == 3 else bits


def to_internal(
    tensors: dict[str, Tensor], spec: QuantSpec, prefix: str, in_features: int, out_features: int
) -> QuantizedWeight:
    """One GPTQ Linear (tensor-name suffix -> tensor) -> QuantizedWeight, checked against K and N."""
    _check_spec(prefix, spec)
    K, N, b = in_features, out_features, spec.bits
    gs = internal_group_size(spec.group_size, K)
    G = -(-K // gs)
    check_keys(prefix, tensors, ("qweight", "qzeros", "scales"), ("g_idx",))
    qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
    check_tensor(f"{prefix}.qweight", qweight, (dense_words(K, b), N), (torch.int32,))
    check_tensor(f"{prefix}.qzeros", qzeros, (G, dense_words(N, b)), (torch.int32,))
    check_tensor(f"{prefix}.scales", scales, (G, N), FLOAT_DTYPES)

    codes = unpack_dense(qweight, b, K)  # [K, N]
    words = to_unsigned(qzeros)
    if spec.format == "gptq" and b != 3:
        words = words + _field_ones(b)  # v1: whole-word add, wraps mod 2^32 (to_unsigned masks it)
    zeros = unpack_dense(words.T, b, N).T  # [G, N]
    if spec.format == "gptq" and b == 3:
        zeros = (zeros + 1) % 8  # v1 3-bit: per field, as GPTQModel's _shift_gptq_qzeros does

    perm = None
    if "g_idx" in tensors:
        g_idx = tensors["g_idx"]
        check_tensor(f"{prefix}.g_idx", g_idx, (K,), (torch.int32,))
        perm = sort_by_group(f"{prefix}.g_idx", g_idx, gs)
        if perm is not None:
            codes = codes[perm.long()]

    implicit = 1 << (b - 1)
    if spec.sym and not torch.all(zeros == implicit):
        stored = implicit - 1 if spec.format == "gptq" else implicit
        raise ValueError(
            f"{prefix}.qzeros: symmetric {spec.format} checkpoint must store {stored} in every field "
            f"(true zero {implicit}), found true zeros {zeros.unique().tolist()[:8]}"
        )
    keep_zeros = not spec.sym or b == 3  # widened 3-bit needs explicit zeros: 2^(4-1) != 4
    return QuantizedWeight(
        qweight=pack_codes(codes, _container_bits(b)),
        scales=scales,
        zeros=zeros.to(scales.dtype) if keep_zeros else None,
        bits=_container_bits(b),
        group_size=gs,
        perm=perm,
        in_features=K,
    )


def from_internal(qw: QuantizedWeight, spec: QuantSpec) -> dict[str, Tensor]:
    """QuantizedWeight -> GPTQ tensors {qweight, qzeros, scales, g_idx}, v1 or v2 per `spec.format`."""
    _check_spec("GPTQ from_internal", spec)
    K, N, b = qw.in_features, qw.out_features, spec.bits
    check_container(qw, b, spec.group_size, "GPTQ")

    codes = natural_codes(qw, b)
    zeros = integer_zeros(qw, b)
    if spec.sym and not torch.all(zeros == 1 << (b - 1)):
        raise ValueError(f"QuantizedWeight.zeros: symmetric GPTQ needs every zero point = {1 << (b - 1)}")
    if spec.format == "gptq" and b == 3:
        qzeros = pack_dense(((zeros - 1) % 8).T, b).T
    elif spec.format == "gptq":
        # v1 = v2 words minus a 1 in every field, with wraparound: the borrow GPTQModel writes.
        qzeros = to_int32(to_unsigned(pack_dense(zeros.T, b).T) - _field_ones(b))
    else:
        qzeros = pack_dense(zeros.T, b).T
    return {
        "qweight": pack_dense(codes, b),
        "qzeros": qzeros.contiguous(),
        "scales": qw.scales,
        "g_idx": group_index(qw.perm, K, qw.group_size),
    }
