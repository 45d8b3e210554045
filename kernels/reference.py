"""Pure-torch reference ops: the correctness oracle and the CPU backend.

Everything here is written for clarity, in fp32 where precision matters; the Triton
kernels in `edgellm.kernels.triton` are tested against these functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Pack unsigned codes [K, N] (values < 2^bits) along K into int32 [ceil(K*bits/32), N], low bits first."""
    if bits not in (2, 4, 8):
        raise ValueError(f"pack_codes: bits expected 2, 4 or 8, got {bits}")
    K, N = codes.shape
    pf = 32 // bits
    rows = -(-K // pf)
    padded = torch.zeros(rows * pf, N, dtype=torch.int64, device=codes.device)
    padded[:K] = codes.to(torch.int64)
    shifts = torch.arange(pf, device=codes.device, dtype=torch.int64) * bits  # [pf]
    words = (padded.view(rows, pf, N) << shifts.view(1, pf, 1)).sum(dim=1)  # [rows, N], < 2^32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # two's complement


def unpack_codes(qweight: Tensor, bits: int, K: int) -> Tensor:
    """Inverse of `pack_codes`: int32 [ceil(K*bits/32), N] -> int32 codes [K, N] in [0, 2^bits)."""
    pf = 32 // bits
    words = qweight.to(torch.int64) & 0xFFFFFFFF  # unsigned view of each word
    shifts = torch.arange(pf, device=qweight.device, dtype=torch.int64) * bits
    fields = (words.unsqueeze(1) >> shifts.view(1, pf, 1)) & ((1 << bits) - 1)  # [rows, pf, N]
    return fields.reshape(-1, qweight.shape[1])[:K].to(torch.int32)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> Tensor:
    """W [K, N] in `dtype`, computed in fp32: (q - z) * s per group. Rows are in `perm` order."""
    K = qw.in_features
    q = unpack_codes(qw.qweight, qw.bits, K).to(torch.float32)  # [K, N]
    group = torch.arange(K, device=q.device) // qw.group_size  # [K]
    s = qw.scales.to(torch.float32)[group]  # [K, N]
    z = (
        torch.full_like(s, float(2 ** (qw.bits - 1)))
        if qw.zeros is None
        else qw.zeros.to(torch.float32)[group]
    )
    return ((q - z) * s).to(dtype)


def quant_matmul_ref(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """y [M, N] = x[:, perm] @ W + bias, accumulated in fp32, returned in x's dtype."""
    xf = x.to(torch.float32)
    if qw.perm is not None:
        xf = xf[..., qw.perm.long()]
    y = xf @ dequantize(qw, torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF Llama RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF rotate-half rotary embedding. x [..., T, H, D]; cos/sin [T, D] broadcast over heads."""
    cos = cos.unsqueeze(-2)
    sin = sin.unsqueeze(-2)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """q [B, T, Hq, D], k/v [B, T, Hkv, D] -> [B, T, Hq, D]; GQA by repeating K/V heads."""
    groups = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
    if groups > 1:
        kt = kt.repeat_interleave(groups, dim=1)
        vt = vt.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    return out.transpose(1, 2)


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Store this step's k/v [T, Hkv, D] into paged caches [num_blocks, block_size, Hkv, D].

    slot_mapping [T] holds block_id * block_size + offset per token; −1 marks a padding
    row whose K/V must not land anywhere (the GPU path pads CUDA-graph batches this way).
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[keep])
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[keep])


def _gather_kv(cache: Tensor, block_rows: Tensor, num_keys: int) -> Tensor:
    """cache [num_blocks, bs, Hkv, D], block_rows [r, nb] -> [r, Hkv, num_keys, D] in token order."""
    r, nb = block_rows.shape
    kv = cache[block_rows].reshape(r, nb * cache.shape[1], *cache.shape[2:])[:, :num_keys]  # [r, L, Hkv, D]
    return kv.transpose(1, 2)


def _sdpa_gqa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q [r, Hq, n, D], k/v [r, Hkv, L, D], boolean mask broadcastable to [r, Hq, n, L] (True = attend)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
) -> Tensor:
    """Attention of a flat batch over paged K/V: q [T, Hq, D] -> [T, Hq, D].

    Request i owns q rows query_start_loc[i] : query_start_loc[i + 1] (n_i tokens) and
    seq_lens[i] keys, read through block_tables[i] ([R, max_blocks], 0-padded). Its first
    c_i = seq_lens[i] − n_i keys were computed in earlier steps, so query j sees keys
    0 .. c_i + j: one rule covers a prefill (c = 0), a prefill chunk and a decode (n = 1).
    Decode rows run as one padded batch; every other request runs on its own.
    The caches must already hold this step's K/V (`write_kv` first).
    """
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    out = torch.empty_like(q)
    decode = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
    if decode:
        idx = torch.tensor(decode, device=q.device)
        rows = query_start_loc[idx]  # the decode rows' token index in the flat batch
        num_keys = max(lens[i] for i in decode)
        blocks = block_tables[idx, : -(-num_keys // block_size)]
        k = _gather_kv(k_cache, blocks, num_keys)
        v = _gather_kv(v_cache, blocks, num_keys)
        mask = torch.arange(num_keys, device=q.device) < seq_lens[idx].unsqueeze(1)  # [r, L]: own keys only
        o = _sdpa_gqa(q[rows].unsqueeze(2), k, v, mask[:, None, None, :], scale)  # [r, Hq, 1, D]
        out[rows] = o[:, :, 0]
    for i in sorted(set(range(len(lens))) - set(decode)):
        s, e, num_keys = starts[i], starts[i + 1], lens[i]
        blocks = block_tables[i : i + 1, : -(-num_keys // block_size)]
        k = _gather_kv(k_cache, blocks, num_keys)
        v = _gather_kv(v_cache, blocks, num_keys)
        first = num_keys - (e - s)  # keys computed before this step
        qpos = first + torch.arange(e - s, device=q.device)
        mask = torch.arange(num_keys, device=q.device) <= qpos.unsqueeze(1)  # [n, L] causal from `first` on
        o = _sdpa_gqa(q[s:e].transpose(0, 1).unsqueeze(0), k, v, mask, scale)  # [1, Hq, n, D]
        out[s:e] = o[0].transpose(0, 1)
    return out
