"""KVCache: the paged K/V tensors of every layer, and the block copies of swap (design §4.7).

    layer l:  [2, num_blocks, block_size, Hkv, D]     [0] = K, [1] = V
                  block 0 is the null block: padding in block tables points at it

The device pool and the CPU swap pool are two KVCache objects with the same per-block
shape; `swap_blocks` moves whole blocks between them. On the CPU backend both live
in RAM (the mechanism, preemption and accounting stay the same as on a GPU).

Every slot attention gathers must hold a finite number, even slots it masks out: a
padded decode group reads the null block and the unwritten tail of partial blocks,
and a masked NaN or Inf still poisons SDPA (0 * NaN = NaN). So the device pool is
zero-filled at allocation (vLLM does the same). The swap pool may stay uninitialised:
a CPU block is only ever read back after a swap-out wrote all of it.
"""

from __future__ import annotations

import logging

import psutil
import torch
from torch import Tensor

logger = logging.getLogger(__name__)

GIB = 1 << 30


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: str | torch.device, zero: bool, pin_memory: bool = False) -> None:
        shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
        # zero=False (swap pool): torch.empty, whose untouched pages cost no RAM until written
        new = torch.zeros if zero else torch.empty
        self.layers: list[Tensor] = [
            new(shape, dtype=dtype, device=device, pin_memory=pin_memory) for _ in range(num_layers)
        ]
        self.num_blocks = num_blocks

    @staticmethod
    def block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes of one block across all layers, K and V."""
        return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def swap_blocks(src: KVCache, dst: KVCache, pairs: list[tuple[int, int]]) -> None:
    """Copy block src_id of `src` into block dst_id of `dst` for each (src_id, dst_id), every layer."""
    if not pairs:
        return
    src_ids = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=src.layers[0].device)
    dst_ids = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dst.layers[0].device)
    for s, d in zip(src.layers, dst.layers):
        d.index_copy_(1, dst_ids, s.index_select(1, src_ids).to(d.device, non_blocking=True))


def num_swap_blocks(swap_space_gib: float, block_bytes: int) -> int:
    """Blocks in the CPU swap pool: `swap_space` GiB, capped by the RAM available now (0: swap off)."""
    if swap_space_gib <= 0:
        return 0
    want = int(swap_space_gib * GIB)
    available = psutil.virtual_memory().available
    if want > available:
        logger.warning("swap_space %.1f GiB > %.1f GiB available RAM; swap pool capped to what is available",
                       swap_space_gib, available / GIB)
        want = available
    # +1: block 0 of every pool is the null block, never handed out
    return want // block_bytes + 1
