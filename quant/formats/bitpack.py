"""Bit-stream packing shared by the format converters, and their common checks.

Every producer stores b-bit codes as a little-endian bit string cut into int32
words. Along the packed dimension (dim 0 here; callers transpose), code i occupies
global bits [b*i, b*i + b). For b in {2, 4, 8} this is "field i % pf of word i // pf";
for b = 3 (and 5, 6, 7) codes straddle words ("dense" packing, AutoGPTQ/GPTQModel
3-bit and compressed-tensors >= 0.19):

    3-bit, one block of 32 codes in 3 words (bit 0 on the left):
    word 0 | c0  c1 ... c9  | c10 bits 0-1 |
    word 1 | c10 bit 2 | c11 ... c20 | c21 bit 0 |
    word 2 | c21 bits 1-2 | c22 ... c31 |

"Sparse" packing (old compressed-tensors 3-bit) puts floor(32 / b) codes in a word and
leaves the top bits unused: code i is field i % (32 // b) of word i // (32 // b).

Words are int32 in two's complement (the producers' dtype); all arithmetic here is done
in int64 on the unsigned 32-bit value so that logical shifts are used (formats.md T16).
"""

from __future__ import annotations

import torch
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import pack_codes, unpack_codes

WORD_BITS = 32
_WORD_MASK = 0xFFFFFFFF
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def dense_words(count: int, bits: int) -> int:
    """Number of int32 words holding `count` densely packed `bits`-bit codes."""
    return -(-count * bits // WORD_BITS)


def sparse_words(count: int, bits: int) -> int:
    """Number of int32 words holding `count` codes at floor(32 / bits) codes per word."""
    per_word = WORD_BITS // bits
    return -(-count // per_word)


def to_unsigned(words: Tensor) -> Tensor:
    """int32 words -> int64 holding the unsigned 32-bit value."""
    return words.to(torch.int64) & _WORD_MASK


def to_int32(words: Tensor) -> Tensor:
    """int64 values in [0, 2^32) -> int32 with the same bits (two's complement)."""
    words = words & _WORD_MASK
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_dense(words: Tensor, bits: int, count: int) -> Tensor:
    """int32 [W, M] packed along dim 0 -> int32 codes [count, M] (straddling allowed)."""
    if WORD_BITS % bits == 0:  # 2/4/8-bit: nothing straddles, whole-word fields are faster
        return unpack_sparse(words, bits, count)
    u = to_unsigned(words)
    u = torch.cat([u, torch.zeros_like(u[:1])])  # a zero word so that row r + 1 always exists
    pos = torch.arange(count, device=words.device, dtype=torch.int64) * bits
    row, shift = pos // WORD_BITS, (pos % WORD_BITS).unsqueeze(1)  # [count], [count, 1]
    low = u[row] >> shift
    high = (u[row + 1] << (WORD_BITS - shift)) & _WORD_MASK  # the part that straddled into the next word
    return ((low | high) & ((1 << bits) - 1)).to(torch.int32)


def pack_dense(codes: Tensor, bits: int) -> Tensor:
    """Unsigned codes [count, M] (< 2^bits) -> int32 [dense_words(count, bits), M] packed along dim 0."""
    if WORD_BITS % bits == 0:  # 2/4/8-bit: the same bytes as QuantizedWeight's own packing
        return pack_codes(codes, bits)
    count, m = codes.shape
    c = codes.to(torch.int64)
    pos = torch.arange(count, device=codes.device, dtype=torch.int64) * bits
    row, shift = pos // WORD_BITS, (pos % WORD_BITS).unsqueeze(1)
    out = torch.zeros(dense_words(count, bits) + 1, m, dtype=torch.int64, device=codes.device)
    # Fields never overlap, so adding is the same as OR-ing; the part of a straddling code
    # above bit 31 lands in the next word.
    out.index_add_(0, row, (c << shift) & _WORD_MASK)
    out.index_add_(0, row + 1, c >> (WORD_BITS - shift))
    return to_int32(out[:-1])


def unpack_sparse(words: Tensor, bits: int, count: int) -> Tensor:
    """int32 [W, M], floor(32 / bits) codes per word along dim 0 -> int32 codes [count, M]."""
    per_word = WORD_BITS // bits
    u = to_unsigned(words)
    shifts = torch.arange(per_word, device=words.device, dtype=torch.int64) * bits
    fields = (u.unsqueeze(1) >> shifts.view(1, per_word, 1)) & ((1 << bits) - 1)  # [W, per_word, M]
    return fields.reshape(-1, words.shape[1])[:count].to(torch.int32)


def describe(t: Tensor) -> str:
    """'[4, 256] float16': the shape/dtype spelling used in every error message."""
    return f"{list(t.shape)} {dtype_name(t.dtype)}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(name: str, t: Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    """Raise `name: expected [shape] dtype, got [shape] dtype` unless `t` matches."""
    if tuple(t.shape) == shape and t.dtype in dtypes:
        return
    want = dtype_name(t.dtype) if t.dtype in dtypes else "|".join(dtype_name(d) for d in dtypes)
    raise ValueError(f"{name}: expected {list(shape)} {want}, got {describe(t)}")


def check_keys(prefix: str, tensors: dict[str, Tensor], required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    """Every required suffix present, nothing unknown (a `bias` belongs to the loader and is allowed)."""
    for key in required:
        if key not in tensors:
            raise ValueError(f"{prefix}.{key}: missing (tensors present: {sorted(tensors)})")
    unknown = sorted(set(tensors) - set(required) - set(optional) - {"bias"})
    if unknown:
        raise ValueError(f"{prefix}: unexpected tensors {unknown} for this format (expected {list(required + optional)})")


def internal_group_size(group_size: int, in_features: int) -> int:
    """Checkpoint group size -> QuantizedWeight.group_size: -1 (or >= K) means one group of K rows."""
    if group_size == -1 or group_size >= in_features:
        return in_features
    if group_size <= 0:
        raise ValueError(f"quantization_config.group_size: expected -1 or a positive integer, got {group_size}")
    return group_size


def sort_by_group(name: str, g_idx: Tensor, group_size: int) -> Tensor | None:
    """Act-order g_idx [K] -> perm (int32 [K]) that makes groups contiguous, or None if already natural.

    After the sort, row i of the weight is input row perm[i] and belongs to group i // group_size;
    a g_idx for which that does not hold (uneven groups) has no QuantizedWeight form and is refused.
    """
    K = g_idx.shape[0]
    natural = torch.arange(K, device=g_idx.device, dtype=torch.int64) // group_size
    g = g_idx.to(torch.int64)
    if torch.equal(g, natural):
        return None
    perm = torch.sort(g, stable=True).indices
    bad = (g[perm] != natural).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"{name}: groups are not {group_size} rows each after sorting "
            f"(sorted row {i} has group {int(g[perm[i]])}, expected {i // group_size})"
        )
    return perm.to(torch.int32)


def group_index(perm: Tensor | None, in_features: int, group_size: int) -> Tensor:
    """Inverse of `sort_by_group`: the g_idx int32 [K] of natural rows for this perm."""
    natural = torch.arange(in_features, dtype=torch.int32) // group_size
    if perm is None:
        return natural
    g_idx = torch.empty_like(natural)
    g_idx[perm.long()] = natural
    return g_idx


def check_container(qw: QuantizedWeight, bits: int, group_size: int, what: str) -> None:
    """from_internal's precondition: qw holds `bits`-bit codes (3 widened to 4) in groups of `group_size`."""
    container = 4 if bits == 3 else bits
    if qw.bits != container:
        raise ValueError(f"QuantizedWeight.bits: expected {container} for {bits}-bit {what}, got {qw.bits}")
    gs = internal_group_size(group_size, qw.in_features)
    if qw.group_size != gs:
        raise ValueError(f"QuantizedWeight.group_size: expected {gs} for {what} group_size {group_size}, got {qw.group_size}")


def integer_zeros(qw: QuantizedWeight, bits: int) -> Tensor:
    """qw's zero points as int64 [G, N] (None = 2^(qw.bits-1)), checked to be `bits`-bit codes."""
    shape = (qw.num_groups, qw.out_features)
    if qw.zeros is None:
        z = torch.full(shape, float(1 << (qw.bits - 1)))
    else:
        z = qw.zeros.to(torch.float32)
    if not torch.equal(z, z.round()) or z.min() < 0 or z.max() >= 1 << bits:
        raise ValueError(
            f"QuantizedWeight.zeros: zero points must be integers in [0, {(1 << bits) - 1}] to be stored as "
            f"{bits}-bit codes, got [{float(z.min())}, {float(z.max())}]"
        )
    return z.to(torch.int64)


def natural_codes(qw: QuantizedWeight, bits: int) -> Tensor:
    """qw's codes as int32 [K, N] in natural row order (perm undone), checked to be `bits`-bit codes."""
    codes = unpack_codes(qw.qweight, qw.bits, qw.in_features)
    largest = int(codes.max())
    if largest >= 1 << bits:
        raise ValueError(f"QuantizedWeight.qweight: codes must be < {1 << bits} to be stored as {bits}-bit, got {largest}")
    if qw.perm is None:
        return codes
    natural = torch.empty_like(codes)
    natural[qw.perm.long()] = codes  # sorted row i is natural row perm[i]
    return natural
