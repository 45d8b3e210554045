"""AWQ (AutoAWQ 0.2.9, GPTQModel) <-> QuantizedWeight. 4-bit only (all AWQ producers).

GEMM layout (`spec.format == "gemm"`), K-major and packed along N with an interleave:

    qweight int32 [K, ceil(N/8)]   qzeros int32 [G, ceil(N/8)]   scales fp16 [G, N]

    word c of row k:  field  0    1    2    3    4    5    6    7     (4 bits each, bit 0 first)
                      column 8c  8c+2 8c+4 8c+6 8c+1 8c+3 8c+5 8c+7  (AWQ_ORDER)

    so column 8c + j is field AWQ_REVERSE_ORDER[j] = [0, 4, 1, 5, 2, 6, 3, 7][j]. qzeros: same.

GEMV layout (`"gemv"`), N-major, natural field order, zeros/scales padded to Wz*8 groups:

    qweight int32 [N, ceil(K/8)]   word c of row n holds input rows 8c .. 8c+7 in fields 0..7
    qzeros  int32 [N, Wz]          word c of row n holds groups 8c .. 8c+7 (zero-padded)
    scales  fp16  [N, Wz*8]        columns >= G are padding (zeros)
    Wz = ceil(G/8) rounded up to a multiple of 1 (gs >= 128), 2 (gs 64) or 4 (gs 32)

Zero points are stored as is (no offset): w = (q - z) * s. GPTQModel's symmetric AWQ files
(`zero_point: false`) still store z = 8 and are read like any other; only a file with no
qzeros at all (allowed when the spec is symmetric) gets `zeros=None` (implicit 8).
GEMV_FAST (int16 qweight, float zeros) and other versions are refused.
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
    integer_zeros,
    internal_group_size,
    natural_codes,
    pack_dense,
    to_int32,
    to_unsigned,
    unpack_dense,
)
from edgellm.quant.spec import QuantMethod, QuantSpec

BITS = 4
PACK = 8  # 4-bit fields per int32 word
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # field i holds column 8c + AWQ_ORDER[i]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column 8c + j sits in field AWQ_REVERSE_ORDER[j]
FORMATS = ("gemm", "gemv")
_GEMV_WIDTH_MULTIPLE = {32: 4, 64: 2}  # AutoAWQ calculate_zeros_width; gs >= 128 -> 1


def _check_spec(where: str, spec: QuantSpec) -> None:
    if spec.method != QuantMethod.AWQ:
        raise ValueError(f"{where}: AWQ converter called for quant method {spec.method.value!r}")
    if spec.format == "gemv_fast":
        raise ValueError(f"{where}: AWQ version 'gemv_fast' is not supported (int16 interleaved layout); use a GEMM checkpoint")
    if spec.format not in FORMATS:
        raise ValueError(f"{where}: AWQ version expected one of {list(FORMATS)}, got {spec.format!r}")
    if spec.bits != BITS:
        raise ValueError(f"{where}: AWQ bits expected {BITS}, got {spec.bits}")


def _gemv_zero_words(num_groups: int, group_size: int, where: str) -> int:
    """Wz: AutoAWQ's padded width (in int32 words) of GEMV qzeros; scales have Wz*8 columns."""
    if group_size >= 128:
        multiple = 1
    elif group_size in _GEMV_WIDTH_MULTIPLE:
        multiple = _GEMV_WIDTH_MULTIPLE[group_size]
    else:
        raise ValueError(f"{where}: AWQ GEMV group_size expected 32, 64 or >= 128, got {group_size}")
    words = -(-num_groups // PACK)
    return -(-words // multiple) * multiple


def _unpack_gemm(words: Tensor, count: int) -> Tensor:
    """AWQ GEMM int32 [R, W] (interleaved along dim 1) -> codes int32 [R, count]."""
    u = to_unsigned(words)
    shifts = torch.tensor(AWQ_REVERSE_ORDER, dtype=torch.int64) * BITS  # column j reads field REVERSE[j]
    fields = (u.unsqueeze(2) >> shifts) & 0xF  # [R, W, 8] in column order
    return fields.reshape(words.shape[0], -1)[:, :count].to(torch.int32)


def _pack_gemm(codes: Tensor) -> Tensor:
    """Codes [R, count] -> AWQ GEMM int32 [R, ceil(count/8)], interleaved along dim 1."""
    rows, count = codes.shape
    padded = torch.zeros(rows, -(-count // PACK) * PACK, dtype=torch.int64)
    padded[:, :count] = codes.to(torch.int64)
    shifts = torch.tensor(AWQ_REVERSE_ORDER, dtype=torch.int64) * BITS
    return to_int32((padded.view(rows, -1, PACK) << shifts).sum(dim=2))  # fields do not overlap: sum == OR


def to_internal(
    tensors: dict[str, Tensor], spec: QuantSpec, prefix: str, in_features: int, out_features: int
) -> QuantizedWeight:
    """One AWQ Linear (tensor-name suffix -> tensor) -> QuantizedWeight, checked against K and N."""
    _check_spec(prefix, spec)
    K, N = in_features, out_features
    gs = internal_group_size(spec.group_size, K)
    G = -(-K // gs)
    # AutoAWQ cannot write a checkpoint without qzeros, but a zero_point=false one may lack them.
    check_keys(prefix, tensors, ("qweight", "scales") if spec.sym else ("qweight", "qzeros", "scales"), ("qzeros",))
    qweight, scales, qzeros = tensors["qweight"], tensors["scales"], tensors.get("qzeros")

    if spec.format == "gemm":
        check_tensor(f"{prefix}.qweight", qweight, (K, -(-N // PACK)), (torch.int32,))
        check_tensor(f"{prefix}.scales", scales, (G, N), FLOAT_DTYPES)
        codes = _unpack_gemm(qweight, N)  # [K, N]
        if qzeros is not None:
            check_tensor(f"{prefix}.qzeros", qzeros, (G, -(-N // PACK)), (torch.int32,))
            qzeros = _unpack_gemm(qzeros, N)  # [G, N]
    else:
        wz = _gemv_zero_words(G, spec.group_size, f"{prefix}.qzeros")
        check_tensor(f"{prefix}.qweight", qweight, (N, -(-K // PACK)), (torch.int32,))
        check_tensor(f"{prefix}.scales", scales, (N, wz * PACK), FLOAT_DTYPES)
        codes = unpack_dense(qweight.T, BITS, K)  # natural field order along K -> [K, N]
        scales = scales[:, :G].T.contiguous()  # drop the padding groups -> [G, N]
        if qzeros is not None:
            check_tensor(f"{prefix}.qzeros", qzeros, (N, wz), (torch.int32,))
            qzeros = unpack_dense(qzeros.T, BITS, G)  # [G, N]

    return QuantizedWeight(
        qweight=pack_codes(codes, BITS),
        scales=scales,
        zeros=None if qzeros is None else qzeros.to(scales.dtype),
        bits=BITS,
        group_size=gs,
        perm=None,
        in_features=K,
    )


def from_internal(qw: QuantizedWeight, spec: QuantSpec) -> dict[str, Tensor]:
    """QuantizedWeight -> AWQ tensors {qweight, qzeros, scales} in the GEMM or GEMV layout of `spec.format`.

    qzeros is written whenever qw has explicit zeros (what every AWQ producer does), and left out
    for `zeros=None`, which `to_internal` accepts back when the spec is symmetric.
    """
    _check_spec("AWQ from_internal", spec)
    check_container(qw, BITS, spec.group_size, "AWQ")
    if qw.perm is not None:
        raise ValueError("QuantizedWeight.perm: AWQ has no act-order; expected None")
    K, G = qw.in_features, qw.num_groups
    codes = natural_codes(qw, BITS)  # [K, N]
    zeros = None if qw.zeros is None else integer_zeros(qw, BITS)  # [G, N]
    if spec.format == "gemm":
        out = {"qweight": _pack_gemm(codes), "scales": qw.scales}
        if zeros is not None:
            out["qzeros"] = _pack_gemm(zeros)
        return out
    wz = _gemv_zero_words(G, spec.group_size, "AWQ from_internal")
    scales = torch.zeros(qw.out_features, wz * PACK, dtype=qw.scales.dtype)
    scales[:, :G] = qw.scales.T
    out = {"qweight": pack_dense(codes, BITS).T.contiguous(), "scales": scales}
    if zeros is not None:
        padded = torch.zeros(wz * PACK, qw.out_features, dtype=torch.int64)
        padded[:G] = zeros
        out["qzeros"] = pack_dense(padded, BITS).T.contiguous()
    return out
