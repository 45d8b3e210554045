"""Pure-torch reference ops: the correctness oracle and the CPU backend.

Everything here is written for clarity, in fp32 where precision matters; the Triton
kernels in `edgellm.kernels.triton` are tested against these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class AttentionGroup:
    """Requests attended in one SDPA call: r requests of n query rows each, up to num_keys keys."""

    rows: Tensor | slice  # their flat q rows, request-major ([r] for decode rows, s:e for one request)
    r: int
    n: int
    num_keys: int
    blocks: Tensor  # [r * nb] block ids, request-major (index_select input)
    mask: Tensor  # bool [r, n, num_keys]: True = attend


@dataclass(frozen=True, slots=True)
class PagedAttentionPlan:
    """The index work of one flat-batch step, done once and shared by every layer.

    Request i owns q rows query_start_loc[i] : query_start_loc[i + 1] (n_i tokens) and
    seq_lens[i] keys, read through block_tables[i] ([R, max_blocks], 0-padded). Its first
    c_i = seq_lens[i] − n_i keys were computed in earlier steps, so query j sees keys
    0 .. c_i + j: one rule covers a prefill (c = 0), a prefill chunk and a decode (n = 1).
    Decode rows form one padded group; every other request is a group of its own.
    """

    write_rows: Tensor | None  # rows whose slot is >= 0; None when every row is written
    write_slots: Tensor  # [T'] their cache slots
    groups: list[AttentionGroup]

    @classmethod
    def build(cls, slot_mapping: Tensor, block_tables: Tensor, seq_lens: Tensor, query_start_loc: Tensor,
              block_size: int) -> PagedAttentionPlan:
        dev = slot_mapping.device
        keep = slot_mapping >= 0
        all_rows = bool(keep.all())
        write_rows = None if all_rows else keep.nonzero().squeeze(1)
        write_slots = slot_mapping if all_rows else slot_mapping[write_rows]
        starts = query_start_loc.tolist()
        lens = seq_lens.tolist()
        groups = []
        decode = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
        if decode:
            idx = torch.tensor(decode, device=dev)
            num_keys = max(lens[i] for i in decode)
            blocks = block_tables[idx, : -(-num_keys // block_size)].reshape(-1)
            mask = torch.arange(num_keys, device=dev) < seq_lens[idx].unsqueeze(1)  # [r, L]: own keys only
            groups.append(AttentionGroup(query_start_loc[idx], len(decode), 1, num_keys, blocks, mask.unsqueeze(1)))
        for i in sorted(set(range(len(lens))) - set(decode)):
            s, e, num_keys = starts[i], starts[i + 1], lens[i]
            first = num_keys - (e - s)  # keys computed before this step
            qpos = first + torch.arange(e - s, device=dev)
            mask = torch.arange(num_keys, device=dev) <= qpos.unsqueeze(1)  # [n, L] causal from `first` on
            blocks = block_tables[i, : -(-num_keys // block_size)]
            groups.append(AttentionGroup(slice(s, e), 1, e - s, num_keys, blocks, mask.unsqueeze(0)))
        return cls(write_rows, write_slots, groups)

    def write(self, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor) -> None:
        """Store this step's k/v [T, Hkv, D] into the paged caches [num_blocks, block_size, Hkv, D]."""
        if self.write_rows is not None:
            k, v = k[self.write_rows], v[self.write_rows]
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, self.write_slots, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, self.write_slots, v)

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, scale: float) -> Tensor:
        """q [T, Hq, D] -> [T, Hq, D]; the caches already hold this step's K/V (`write` first)."""
        out = torch.empty_like(q)
        for g in self.groups:
            k = _gather_kv(k_cache, g.blocks, g.r, g.num_keys)
            v = _gather_kv(v_cache, g.blocks, g.r, g.num_keys)
            o = _attend(q[g.rows].view(g.r, g.n, *q.shape[1:]), k, v, g.mask, scale)
            out[g.rows] = o.view(g.r * g.n, *q.shape[1:])
        return out


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Store this step's k/v [T, Hkv, D] into paged caches [num_blocks, block_size, Hkv, D].

    slot_mapping [T] holds block_id * block_size + offset per token; −1 marks a padding
    row whose K/V must not land anywhere (the GPU path pads CUDA-graph batches this way).
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[keep])
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[keep])


def _gather_kv(cache: Tensor, blocks: Tensor, r: int, num_keys: int) -> Tensor:
    """cache [num_blocks, bs, Hkv, D], blocks [r * nb] request-major -> [r, Hkv, num_keys, D] in token order."""
    # index_select on the block dim: one contiguous copy per block, about twice as fast as cache[block_rows]
    kv = cache.index_select(0, blocks).view(r, -1, *cache.shape[2:])
    return kv[:, :num_keys].transpose(1, 2)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """q [r, n, Hq, D], k/v [r, Hkv, L, D], boolean mask [r, n, L] (True = attend) -> [r, n, Hq, D].

    GQA without copying K/V: the G = Hq / Hkv query heads that share a KV head become G * n
    query rows of that head (head h reads KV head h // G, as in transformers).
    """
    r, n, hq, d = q.shape
    hkv, L = k.shape[1], k.shape[2]
    g = hq // hkv
    qf = q.view(r, n, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(r, hkv, g * n, d)
    m = mask.unsqueeze(1).expand(r, g, n, L).reshape(r, 1, g * n, L)
    o = F.scaled_dot_product_attention(qf, k, v, attn_mask=m, scale=scale)  # [r, Hkv, G * n, D]
    return o.view(r, hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(r, n, hq, d)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
) -> Tensor:
    """Attention of a flat batch over paged K/V: q [T, Hq, D] -> [T, Hq, D] (rules: `PagedAttentionPlan`).

    The caches must already hold this step's K/V (`write_kv` first). The engine builds the
    plan once per step instead (`ForwardContext.plan`); this one-call form is the oracle.
    """
    slots = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)  # unused by attend
    plan = PagedAttentionPlan.build(slots, block_tables, seq_lens, query_start_loc, k_cache.shape[1])
    return plan.attend(q, k_cache, v_cache, scale)
