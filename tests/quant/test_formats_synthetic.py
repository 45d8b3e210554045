"""Converters on layouts no fixture covers, packed here independently in numpy from formats.md.

Random codes, zeros and scales are packed in the producer's layout by the numpy packers
below (bit strings via np.packbits, not the converters' code), converted, dequantized with
the reference op, and compared exactly with (q - z) * s computed directly. The same inputs,
corrupted one field at a time, check the one-line errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import dequantize
from edgellm.quant.formats import awq, compressed_tensors, gptq
from edgellm.quant.spec import QuantMethod, QuantSpec

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # field i of an AWQ GEMM word holds column 8c + AWQ_ORDER[i]
PREFIX = "model.layers.3.mlp.down_proj"


def np_pack_stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [count, M] -> int32 [ceil(count*b/32), M]: code i at global bits [b*i, b*i+b), LSB first."""
    count, m = codes.shape
    bit_rows = ((codes[:, None, :] >> np.arange(bits)[None, :, None]) & 1).reshape(count * bits, m)
    nwords = -(-count * bits // 32)
    stream = np.zeros((nwords * 32, m), np.uint8)
    stream[: count * bits] = bit_rows
    as_bytes = np.packbits(stream.reshape(nwords, 32, m).transpose(0, 2, 1), axis=2, bitorder="little")
    return np.ascontiguousarray(as_bytes).view("<i4").reshape(nwords, m).astype(np.int32)


def np_pack_per_word(codes: np.ndarray, bits: int) -> np.ndarray:
    """codes [count, M] -> int32 words with floor(32/b) codes each, top bits unused (old compressed-tensors)."""
    per_word = 32 // bits
    count, m = codes.shape
    words = np.zeros((-(-count // per_word), m), np.uint64)
    for i in range(count):
        words[i // per_word] |= codes[i].astype(np.uint64) << np.uint64(bits * (i % per_word))
    return words.astype(np.uint32).view(np.int32)


def np_pack_awq(codes: np.ndarray) -> np.ndarray:
    """codes [R, N] -> AWQ GEMM int32 [R, N/8], interleaved."""
    words = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        words |= codes[:, col::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def random_quant(K: int, N: int, gs: int, bits: int, seed: int, zero_range: tuple[int, int] | None = None):
    """Codes q [K, N], zeros z [G, N] (None: symmetric), scales s fp16 [G, N]."""
    rng = np.random.default_rng(seed)
    G = -(-K // gs)
    q = rng.integers(0, 1 << bits, size=(K, N))
    z = None if zero_range is None else rng.integers(zero_range[0], zero_range[1] + 1, size=(G, N))
    s = torch.from_numpy(rng.uniform(0.001, 0.05, size=(G, N))).to(torch.float16)
    return q, z, s


def expected_weight(q: np.ndarray, z: np.ndarray | int, s: Tensor, gs: int, g_idx: np.ndarray | None = None) -> Tensor:
    """(q - z) * s in fp32, [K, N] natural rows; groups by g_idx (or k // gs)."""
    K = q.shape[0]
    g = np.arange(K) // gs if g_idx is None else g_idx
    zk = z if isinstance(z, int) else z[g]
    return (t((q - zk).astype(np.float32)) * s.float()[t(g).long()]).float()


def natural_dequant(qw: QuantizedWeight) -> Tensor:
    w = dequantize(qw)
    if qw.perm is None:
        return w
    natural = torch.empty_like(w)
    natural[qw.perm.long()] = w
    return natural


def assert_round_trip(conv, tensors: dict[str, Tensor], spec: QuantSpec, K: int, N: int) -> QuantizedWeight:
    qw = conv.to_internal(tensors, spec, PREFIX, K, N)
    back = conv.from_internal(qw, spec)
    assert sorted(back) == sorted(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    again = conv.to_internal(back, spec, PREFIX, K, N)
    assert torch.equal(again.qweight, qw.qweight) and torch.equal(again.scales, qw.scales)
    return qw


def gptq_spec(bits: int, gs: int, sym: bool, fmt: str = "gptq", act_order: bool = False) -> QuantSpec:
    return QuantSpec(QuantMethod.GPTQ, bits, gs, sym, act_order, fmt)


def ct_spec(bits: int, gs: int, sym: bool, act_order: bool = False) -> QuantSpec:
    return QuantSpec(QuantMethod.COMPRESSED_TENSORS, bits, gs, sym, act_order, "pack-quantized")


# ---------------------------------------------------------------- GPTQ


def gptq_tensors(q, zeros_stored, s, g_idx, bits) -> dict[str, Tensor]:
    return {
        "qweight": t(np_pack_stream(q, bits)),
        "qzeros": t(np_pack_stream(zeros_stored.T, bits).T),
        "scales": s,
        "g_idx": t(g_idx.astype(np.int32)),
    }


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_3bit_symmetric(fmt: str) -> None:
    K, N, gs = 256, 64, 128
    q, _, s = random_quant(K, N, gs, 3, seed=1)
    stored = np.full((K // gs, N), 3 if fmt == "gptq" else 4)  # v1 stores z - 1
    spec = gptq_spec(3, gs, sym=True, fmt=fmt)
    qw = assert_round_trip(gptq, gptq_tensors(q, stored, s, np.arange(K) // gs, 3), spec, K, N)
    assert qw.bits == 4 and qw.zeros is not None and torch.all(qw.zeros == 4)
    assert torch.equal(natural_dequant(qw), expected_weight(q, 4, s, gs))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptqmodel_v1_true_zero_of_zero_borrows(bits: int) -> None:
    """GPTQModel writes v1 by subtracting 0x11111111 (4-bit) from each v2 word: a zero of 0 borrows (T2)."""
    K, N, gs = 128, 32, 32
    q, z, s = random_quant(K, N, gs, bits, seed=bits, zero_range=(0, (1 << bits) - 1))
    z[:, ::3] = 0  # plenty of true zeros of 0, next to neighbours of every value
    ones = sum(1 << (j * bits) for j in range(32 // bits))
    v2 = np_pack_stream(z.T, bits).T.view(np.uint32).astype(np.uint64)
    v1 = ((v2 - np.uint64(ones)) % np.uint64(1 << 32)).astype(np.uint32).view(np.int32)
    tensors = {
        "qweight": t(np_pack_stream(q, bits)),
        "qzeros": t(v1),
        "scales": s,
        "g_idx": t((np.arange(K) // gs).astype(np.int32)),
    }
    qw = assert_round_trip(gptq, tensors, gptq_spec(bits, gs, sym=False), K, N)
    assert torch.equal(qw.zeros, t(z).to(torch.float16))
    assert torch.equal(natural_dequant(qw), expected_weight(q, z, s, gs))


def test_gptq_act_order_with_partial_last_group() -> None:
    K, N, gs = 320, 64, 128  # groups of 128, 128, 64
    q, z, s = random_quant(K, N, gs, 4, seed=5, zero_range=(1, 15))
    g_idx = np.random.default_rng(6).permutation(np.arange(K) // gs)
    tensors = gptq_tensors(q, z - 1, s, g_idx, 4)
    qw = assert_round_trip(gptq, tensors, gptq_spec(4, gs, sym=False, act_order=True), K, N)
    assert qw.perm is not None and torch.equal(t(g_idx)[qw.perm.long()], torch.arange(K) // gs)
    assert torch.equal(natural_dequant(qw), expected_weight(q, z, s, gs, g_idx))


def test_gptq_bf16_scales_stay_bf16() -> None:
    K, N, gs = 128, 64, 64
    q, z, s = random_quant(K, N, gs, 4, seed=7, zero_range=(1, 15))
    tensors = gptq_tensors(q, z, s.to(torch.bfloat16), np.arange(K) // gs, 4)
    qw = assert_round_trip(gptq, tensors, gptq_spec(4, gs, sym=False, fmt="gptq_v2"), K, N)
    assert qw.scales.dtype == qw.zeros.dtype == torch.bfloat16
    assert torch.equal(natural_dequant(qw), expected_weight(q, z, s.to(torch.bfloat16), gs))


# ---------------------------------------------------------------- AWQ


def test_awq_gemm_without_zero_points() -> None:
    """zero_point: false with no qzeros tensor at all: implicit zero 8."""
    K, N, gs = 256, 64, 128
    q, _, s = random_quant(K, N, gs, 4, seed=8)
    spec = QuantSpec(QuantMethod.AWQ, 4, gs, True, False, "gemm")
    qw = assert_round_trip(awq, {"qweight": t(np_pack_awq(q)), "scales": s}, spec, K, N)
    assert qw.zeros is None
    assert torch.equal(dequantize(qw), expected_weight(q, 8, s, gs))


def test_awq_gemm_symmetric_with_stored_eights() -> None:
    """GPTQModel's sym AWQ: zero_point false, qzeros full of 8 (T6): used as stored."""
    K, N, gs = 128, 32, 64
    q, _, s = random_quant(K, N, gs, 4, seed=9)
    tensors = {"qweight": t(np_pack_awq(q)), "qzeros": t(np_pack_awq(np.full((K // gs, N), 8))), "scales": s}
    qw = assert_round_trip(awq, tensors, QuantSpec(QuantMethod.AWQ, 4, gs, True, False, "gemm"), K, N)
    assert torch.all(qw.zeros == 8)
    assert torch.equal(dequantize(qw), expected_weight(q, 8, s, gs))


def test_awq_gemv_group64_padding() -> None:
    """GEMV at gs 64: zeros width rounded up to a multiple of 2 words, scales to 16 columns."""
    K, N, gs = 256, 16, 64
    q, z, s = random_quant(K, N, gs, 4, seed=10, zero_range=(0, 15))
    G, wz = K // gs, 2
    zeros_padded = np.zeros((wz * 8, N), np.int64)
    zeros_padded[:G] = z
    scales = torch.zeros(N, wz * 8, dtype=torch.float16)
    scales[:, :G] = s.T
    tensors = {
        "qweight": t(np_pack_stream(q, 4).T),
        "qzeros": t(np_pack_stream(zeros_padded, 4).T),
        "scales": scales,
    }
    qw = assert_round_trip(awq, tensors, QuantSpec(QuantMethod.AWQ, 4, gs, False, False, "gemv"), K, N)
    assert torch.equal(dequantize(qw), expected_weight(q, z, s, gs))


# ---------------------------------------------------------------- compressed-tensors


def ct_tensors(q, u_zeros, s, bits, K, N, old: bool = False) -> dict[str, Tensor]:
    """q [K, N], u_zeros [G, N] unsigned (None: symmetric) -> pack-quantized tensors."""
    pack = np_pack_per_word if old else np_pack_stream
    out = {
        "weight_packed": t(pack(q, bits).T),  # [N, words]: row n packed along K
        "weight_scale": s.T.contiguous(),
        "weight_shape": torch.tensor([N, K], dtype=torch.int64),
    }
    if u_zeros is not None:
        if old:
            out["weight_zero_point"] = t((u_zeros.T - (1 << (bits - 1))).astype(np.int8))  # signed, [N, G]
        else:
            out["weight_zero_point"] = t(np_pack_stream(u_zeros.T, bits))  # [ceil(N*b/32), G]
    return out


@pytest.mark.parametrize("sym", [True, False])
def test_compressed_tensors_3bit_dense(sym: bool) -> None:
    K, N, gs = 200, 40, 64  # 600 bits -> 19 words per row (10-per-word would be 20); partial last group
    q, z, s = random_quant(K, N, gs, 3, seed=11, zero_range=None if sym else (0, 7))
    qw = assert_round_trip(compressed_tensors, ct_tensors(q, z, s, 3, K, N), ct_spec(3, gs, sym), K, N)
    assert qw.bits == 4 and qw.zeros is not None
    assert torch.equal(dequantize(qw), expected_weight(q, 4 if sym else z, s, gs))


def test_compressed_tensors_3bit_old_ten_per_word() -> None:
    """Old releases: 10 codes per word, int8 signed zero points [N, G]; read, then written back dense."""
    K, N, gs = 200, 40, 64
    q, z, s = random_quant(K, N, gs, 3, seed=12, zero_range=(0, 7))
    tensors = ct_tensors(q, z, s, 3, K, N, old=True)
    assert tensors["weight_packed"].shape == (N, 20)
    spec = ct_spec(3, gs, sym=False)
    qw = compressed_tensors.to_internal(tensors, spec, PREFIX, K, N)
    assert torch.equal(dequantize(qw), expected_weight(q, z, s, gs))
    dense = compressed_tensors.from_internal(qw, spec)
    assert torch.equal(dense["weight_packed"], t(np_pack_stream(q, 3).T))


@pytest.mark.parametrize("act_order", [False, True])
def test_compressed_tensors_partial_groups(act_order: bool) -> None:
    K, N, gs = 320, 48, 128  # 2.5 groups; N*4 bits = 6 zero-point words
    q, z, s = random_quant(K, N, gs, 4, seed=13, zero_range=(0, 15))
    tensors = ct_tensors(q, z, s, 4, K, N)
    g_idx = None
    if act_order:
        g_idx = np.random.default_rng(14).permutation(np.arange(K) // gs)
        tensors["weight_g_idx"] = t(g_idx.astype(np.int32))
    qw = assert_round_trip(compressed_tensors, tensors, ct_spec(4, gs, sym=False, act_order=act_order), K, N)
    assert qw.num_groups == 3 and (qw.perm is not None) == act_order
    assert torch.equal(natural_dequant(qw), expected_weight(q, z, s, gs, g_idx))


def test_compressed_tensors_channel_strategy_8bit() -> None:
    K, N = 96, 24
    q, z, s = random_quant(K, N, K, 8, seed=15, zero_range=(0, 255))
    qw = assert_round_trip(compressed_tensors, ct_tensors(q, z, s, 8, K, N), ct_spec(8, -1, sym=False), K, N)
    assert qw.group_size == K
    assert torch.equal(dequantize(qw), expected_weight(q, z, s, K))


# ---------------------------------------------------------------- refusals


def valid_gptq(K: int = 512, N: int = 256, gs: int = 128) -> dict[str, Tensor]:
    q, z, s = random_quant(K, N, gs, 4, seed=20, zero_range=(1, 15))
    return gptq_tensors(q, z - 1, s, np.arange(K) // gs, 4)


def raises(match: str, conv, tensors: dict[str, Tensor], spec: QuantSpec, K: int, N: int) -> None:
    with pytest.raises(ValueError, match=match):
        conv.to_internal(tensors, spec, PREFIX, K, N)


def test_wrong_shape_names_tensor_expected_and_got() -> None:
    tensors = valid_gptq()
    tensors["scales"] = tensors["scales"][:3]
    with pytest.raises(ValueError) as err:
        gptq.to_internal(tensors, gptq_spec(4, 128, sym=False), PREFIX, 512, 256)
    assert str(err.value) == f"{PREFIX}.scales: expected [4, 256] float16, got [3, 256] float16"


def test_shapes_are_checked_against_config_dims() -> None:
    spec = gptq_spec(4, 128, False)
    raises(r"\.qweight: expected \[32, 256\] int32, got \[64, 256\] int32", gptq, valid_gptq(), spec, 256, 256)
    tensors = valid_gptq()
    tensors["qzeros"] = tensors["qzeros"][:, :31].contiguous()
    raises(r"\.qzeros: expected \[4, 32\] int32, got \[4, 31\] int32", gptq, tensors, spec, 512, 256)
    short_g_idx = valid_gptq() | {"g_idx": torch.zeros(511, dtype=torch.int32)}
    raises(r"\.g_idx: expected \[512\] int32, got \[511\] int32", gptq, short_g_idx, spec, 512, 256)


def test_wrong_dtypes_are_refused() -> None:
    spec = gptq_spec(4, 128, sym=False)
    for key, dtype, match in [
        ("qweight", torch.int64, r"\.qweight: expected \[64, 256\] int32, got \[64, 256\] int64"),
        ("scales", torch.float64, r"\.scales: expected \[4, 256\] float16\|bfloat16\|float32, got \[4, 256\] float64"),
        ("g_idx", torch.int64, r"\.g_idx: expected \[512\] int32, got \[512\] int64"),
    ]:
        tensors = valid_gptq()
        tensors[key] = tensors[key].to(dtype)
        raises(match, gptq, tensors, spec, 512, 256)


def test_inconsistent_g_idx_is_refused() -> None:
    tensors = valid_gptq()
    g_idx = tensors["g_idx"].clone()
    g_idx[0] = 1  # group 0 gets 127 rows, group 1 gets 129
    tensors["g_idx"] = g_idx
    raises(rf"^{PREFIX}\.g_idx: groups are not 128 rows each after sorting", gptq, tensors, gptq_spec(4, 128, False), 512, 256)


def test_missing_and_unexpected_tensors() -> None:
    tensors = valid_gptq()
    del tensors["qzeros"]
    raises(r"\.qzeros: missing", gptq, tensors, gptq_spec(4, 128, False), 512, 256)
    tensors = valid_gptq() | {"weight": torch.zeros(1), "bias": torch.zeros(256)}  # bias is the loader's, allowed
    raises(r"unexpected tensors \['weight'\]", gptq, tensors, gptq_spec(4, 128, False), 512, 256)


def test_symmetric_gptq_with_other_zeros_is_refused() -> None:
    raises(r"\.qzeros: symmetric gptq checkpoint must store 7", gptq, valid_gptq(), gptq_spec(4, 128, sym=True), 512, 256)


def test_unsupported_bits_and_formats() -> None:
    raises(r"GPTQ bits expected one of \[2, 3, 4, 8\], got 5", gptq, valid_gptq(), gptq_spec(5, 128, False), 512, 256)
    raises(r"GPTQ checkpoint format .* got 'marlin'", gptq, valid_gptq(), gptq_spec(4, 128, False, fmt="marlin"), 512, 256)
    awq_tensors = {"qweight": torch.zeros(512, 32, dtype=torch.int32), "scales": torch.ones(4, 256, dtype=torch.float16)}
    raises(r"AWQ bits expected 4, got 8", awq, awq_tensors, QuantSpec(QuantMethod.AWQ, 8, 128, True, False, "gemm"), 512, 256)
    gemv_fast = QuantSpec(QuantMethod.AWQ, 4, 128, True, False, "gemv_fast")
    raises(r"AWQ version 'gemv_fast' is not supported", awq, awq_tensors, gemv_fast, 512, 256)
    raises(r"AWQ GEMV group_size expected 32, 64 or >= 128, got 16", awq, awq_tensors,
           QuantSpec(QuantMethod.AWQ, 4, 16, True, False, "gemv"), 512, 256)
    q, z, s = random_quant(64, 32, 32, 4, seed=21, zero_range=(0, 15))
    ct = ct_tensors(q, z, s, 4, 64, 32)
    raises(r"num_bits expected one of \[2, 3, 4, 8\], got 6", compressed_tensors, ct, ct_spec(6, 32, False), 64, 32)
    bad = QuantSpec(QuantMethod.COMPRESSED_TENSORS, 4, 32, False, False, "marlin-24")
    raises(r"format expected 'pack-quantized', got 'marlin-24'", compressed_tensors, ct, bad, 64, 32)


def test_awq_asymmetric_needs_qzeros() -> None:
    awq_tensors = {"qweight": torch.zeros(512, 32, dtype=torch.int32), "scales": torch.ones(4, 256, dtype=torch.float16)}
    raises(r"\.qzeros: missing", awq, awq_tensors, QuantSpec(QuantMethod.AWQ, 4, 128, False, False, "gemm"), 512, 256)


def test_compressed_tensors_refusals() -> None:
    K, N, gs = 200, 40, 64
    q, z, s = random_quant(K, N, gs, 3, seed=22, zero_range=(0, 7))
    spec = ct_spec(3, gs, sym=False)
    tensors = ct_tensors(q, z, s, 3, K, N)
    wrong_shape = tensors | {"weight_shape": torch.tensor([40, 199])}
    raises(r"\.weight_shape: expected \[40, 200\]", compressed_tensors, wrong_shape, spec, K, N)
    raises(r"\.weight_zero_point: missing", compressed_tensors,
           {k: v for k, v in tensors.items() if k != "weight_zero_point"}, spec, K, N)
    raises(r"\.weight_packed: expected \[40, 19\] int32 \(or \[40, 20\] with 10 codes per word\), got \[40, 18\] int32",
           compressed_tensors, tensors | {"weight_packed": tensors["weight_packed"][:, :18].contiguous()}, spec, K, N)
    raises(r"\.weight_zero_point: symmetric checkpoint with non-zero zero points", compressed_tensors, tensors,
           ct_spec(3, gs, sym=True), K, N)


def test_from_internal_refuses_what_the_format_cannot_hold() -> None:
    qw = gptq.to_internal(valid_gptq(), gptq_spec(4, 128, sym=False), PREFIX, 512, 256)
    fractional = QuantizedWeight(qw.qweight, qw.scales, qw.zeros + 0.5, 4, 128, None, 512)
    with pytest.raises(ValueError, match=r"^QuantizedWeight\.zeros: zero points must be integers in \[0, 15\]"):
        gptq.from_internal(fractional, gptq_spec(4, 128, sym=False))
    with pytest.raises(ValueError, match=r"^QuantizedWeight\.bits: expected 8 for 8-bit GPTQ, got 4"):
        gptq.from_internal(qw, gptq_spec(8, 128, sym=False))
    with pytest.raises(ValueError, match=r"^QuantizedWeight\.qweight: codes must be < 8 to be stored as 3-bit"):
        gptq.from_internal(qw, gptq_spec(3, 128, sym=False))
