"""compressed-tensors `pack-quantized` (llm-compressor) <-> QuantizedWeight.

Tensors of one Linear, HF orientation [N, K] (K = in_features, N = out_features, G = ceil(K/gs)):

    weight_packed      int32 [N, ceil(K*b/32)]   codes packed along K (dim 1), bit stream, LSB first
    weight_scale       fp16|bf16 [N, G]          (channel strategy: G = 1)
    weight_zero_point  int32 [ceil(N*b/32), G]   asymmetric only; packed along N (dim 0), same rule
                       or int8 [N, G]            (older releases: not packed, signed)
    weight_shape       int64 [2] = (N, K)
    weight_g_idx       int32 [K]                 only old `actorder: "group"` files

    row n of weight_packed, b = 4:   word c: |k=8c|8c+1|...|8c+7|    (bit 0 first)

Codes are signed q_s in [-2^(b-1), 2^(b-1)) stored with +2^(b-1), i.e. as unsigned
u = q_s + 2^(b-1); packed zero points carry the same offset (uz = zp + 2^(b-1)), so
w = (u - uz) * s and u, uz are QuantizedWeight's codes and zeros as they are. Symmetric
files store no zero point: zp = 0, i.e. the implicit 2^(b-1) (`zeros=None`).

3-bit: compressed-tensors >= 0.19 packs densely (codes straddle words, ceil(3K/32) words per
row); older releases put 10 codes in a word (ceil(K/10) words). The word count tells them
apart (dense is preferred on the rare K where both counts agree; from_internal always writes
dense). 3-bit is widened to 4-bit containers with explicit zeros.
`weight_g_idx` is handled like GPTQ's g_idx: rows sorted by group, perm kept for activations.
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
    describe,
    group_index,
    integer_zeros,
    internal_group_size,
    natural_codes,
    pack_dense,
    sort_by_group,
    sparse_words,
    unpack_dense,
    unpack_sparse,
)
from edgellm.quant.spec import QuantMethod, QuantSpec

BITS = (2, 3, 4, 8)
FORMAT = "pack-quantized"


def _check_spec(where: str, spec: QuantSpec) -> None:
    if spec.method != QuantMethod.COMPRESSED_TENSORS:
        raise ValueError(f"{where}: compressed-tensors converter called for quant method {spec.method.value!r}")
    if spec.format != FORMAT:
        raise ValueError(f"{where}: compressed-tensors format expected {FORMAT!r}, got {spec.format!r}")
    if spec.bits not in BITS:
        raise ValueError(f"{where}: compressed-tensors num_bits expected one of {list(BITS)}, got {spec.bits}")


def _unpack_codes(name: str, packed: Tensor, bits: int, K: int, N: int) -> Tensor:
    """weight_packed [N, words] -> codes int32 [K, N], choosing dense or (3-bit) old sparse packing."""
    dense, sparse = dense_words(K, bits), sparse_words(K, bits)
    if packed.dtype == torch.int32 and packed.dim() == 2 and packed.shape[0] == N:
        if packed.shape[1] == dense:
            return unpack_dense(packed.T, bits, K)
        if packed.shape[1] == sparse:
            return unpack_sparse(packed.T, bits, K)
    also = f" (or [{N}, {sparse}] with {32 // bits} codes per word)" if sparse != dense else ""
    raise ValueError(f"{name}: expected [{N}, {dense}] int32{also}, got {describe(packed)}")


def _unpack_zero_points(name: str, zp: Tensor, bits: int, G: int, N: int) -> Tensor:
    """weight_zero_point -> unsigned zeros int32 [G, N] (packed int32 along N, or old signed int8 [N, G])."""
    if zp.dtype == torch.int8:
        check_tensor(name, zp, (N, G), (torch.int8,))
        return (zp.to(torch.int32) + (1 << (bits - 1))).T.contiguous()
    check_tensor(name, zp, (dense_words(N, bits), G), (torch.int32,))
    return unpack_dense(zp, bits, N).T.contiguous()


def to_internal(
    tensors: dict[str, Tensor], spec: QuantSpec, prefix: str, in_features: int, out_features: int
) -> QuantizedWeight:
    """One pack-quantized Linear (tensor-name suffix -> tensor) -> QuantizedWeight, checked against K and N."""
    _check_spec(prefix, spec)
    K, N, b = in_features, out_features, spec.bits
    gs = internal_group_size(spec.group_size, K)
    G = -(-K // gs)
    check_keys(prefix, tensors, ("weight_packed", "weight_scale", "weight_shape"), ("weight_zero_point", "weight_g_idx"))
    shape = tensors["weight_shape"]
    check_tensor(f"{prefix}.weight_shape", shape, (2,), (torch.int64, torch.int32))
    if shape.tolist() != [N, K]:
        raise ValueError(f"{prefix}.weight_shape: expected [{N}, {K}] (out, in features from config.json), got {shape.tolist()}")
    scales = tensors["weight_scale"]
    check_tensor(f"{prefix}.weight_scale", scales, (N, G), FLOAT_DTYPES)
    scales = scales.T.contiguous()  # [G, N]
    codes = _unpack_codes(f"{prefix}.weight_packed", tensors["weight_packed"], b, K, N)  # [K, N]

    implicit = 1 << (b - 1)
    if "weight_zero_point" in tensors:
        zeros = _unpack_zero_points(f"{prefix}.weight_zero_point", tensors["weight_zero_point"], b, G, N)
        if spec.sym and not torch.all(zeros == implicit):
            raise ValueError(f"{prefix}.weight_zero_point: symmetric checkpoint with non-zero zero points")
    elif not spec.sym:
        raise ValueError(f"{prefix}.weight_zero_point: missing in an asymmetric checkpoint")
    else:
        zeros = torch.full((G, N), implicit, dtype=torch.int32)

    perm = None
    if "weight_g_idx" in tensors:
        g_idx = tensors["weight_g_idx"]
        check_tensor(f"{prefix}.weight_g_idx", g_idx, (K,), (torch.int32,))
        perm = sort_by_group(f"{prefix}.weight_g_idx", g_idx, gs)
        if perm is not None:
            codes = codes[perm.long()]

    keep_zeros = not spec.sym or b == 3  # widened 3-bit needs explicit zeros: 2^(4-1) != 4
    container = 4 if b == 3 else b
    return QuantizedWeight(
        qweight=pack_codes(codes, container),
        scales=scales,
        zeros=zeros.to(scales.dtype) if keep_zeros else None,
        bits=container,
        group_size=gs,
        perm=perm,
        in_features=K,
    )


def from_internal(qw: QuantizedWeight, spec: QuantSpec) -> dict[str, Tensor]:
    """QuantizedWeight -> pack-quantized tensors (dense packing, packed int32 zero points).

    weight_zero_point only for an asymmetric spec; weight_g_idx when the spec has act-order
    (`actorder: "group"`) or qw carries a perm.
    """
    _check_spec("compressed-tensors from_internal", spec)
    check_container(qw, spec.bits, spec.group_size, "compressed-tensors")
    K, N, b = qw.in_features, qw.out_features, spec.bits
    zeros = integer_zeros(qw, b)  # [G, N]
    out = {
        "weight_packed": pack_dense(natural_codes(qw, b), b).T.contiguous(),  # [N, words]
        "weight_scale": qw.scales.T.contiguous(),  # [N, G]
        "weight_shape": torch.tensor([N, K], dtype=torch.int64),
    }
    if spec.sym:
        if not torch.all(zeros == 1 << (b - 1)):
            raise ValueError(f"QuantizedWeight.zeros: symmetric compressed-tensors needs every zero point = {1 << (b - 1)}")
    else:
        out["weight_zero_point"] = pack_dense(zeros.T, b)  # [ceil(N*b/32), G]
    if spec.act_order or qw.perm is not None:
        out["weight_g_idx"] = group_index(qw.perm, K, qw.group_size)
    return out
