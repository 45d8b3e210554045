"""KVCacheManager: the scheduler's only view of memory. Request -> blocks, prefix hits, swap.

Owns two pools: the device pool (prefix-cached) and the CPU swap pool
(`enable_caching=False`; both reserve block 0 as the null block). The scheduler
never touches a KVBlock's fields; it asks and gets block lists or ids back.

allocate_slots, the token regions of one request (vLLM `allocate_slots`):

    |<------------- computed ------------->|<-- new this step -->|
    | already owned  | prefix hit (touched) |   fresh blocks      |
    0        req.num_computed_tokens    + hit tokens       + num_new_tokens
    blocks owned afterwards: ceil((computed + hit + new) / block_size)
    blocks hashed afterwards: every block full once this step's tokens are written

A block is hashed when allocated, before this step's forward writes it. A
request that hits it in the same step is safe: each attention layer writes
the whole step's K/V before any request's attention reads the cache.

Swap (design §4.7): swap_out copies every block of the request (shared prefix
blocks included) to fresh CPU blocks and drops its device refs; swap_in does the
reverse into fresh device blocks and re-hashes the full ones. The runner copies
out before the forward, so a device block freed by swap_out may be handed to
another request in the same step. Invariants: a CPU block has ref_cnt 1 and no
hash; a swapped request owns no device blocks.
Pure Python: no torch.
"""

from __future__ import annotations

from edgellm.engine.block_pool import BlockPool, KVBlock
from edgellm.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.gpu_pool = BlockPool(num_gpu_blocks, enable_caching)
        # num_cpu_blocks 0: no swap space; a pool of just the null block never has room.
        self.cpu_pool = BlockPool(max(num_cpu_blocks, 1), enable_caching=False)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}  # device block table of each running request
        self.req_to_cpu_blocks: dict[str, list[KVBlock]] = {}  # CPU blocks of each swapped request
        self._num_cached_blocks: dict[str, int] = {}  # leading blocks of a request already in the hash map

    @property
    def usage(self) -> float:
        return self.gpu_pool.usage

    @property
    def cpu_usage(self) -> float:
        return self.cpu_pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.gpu_pool.num_free_blocks

    def get_block_ids(self, req: Request) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(req.request_id, ())]

    def get_computed_blocks(self, req: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of a request with no blocks: (blocks, tokens), block-aligned and capped at
        num_tokens - 1 so at least one token is computed to produce logits. Blocks are not touched yet."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in req.block_hashes[:max_blocks]:
            block = self.gpu_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self, req: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock] | None = None
    ) -> list[KVBlock] | None:
        """Make room for num_new_tokens after the computed ones (and the prefix hit). Returns the fresh
        blocks, or None with nothing changed when the pool is short (the scheduler then preempts)."""
        assert num_new_tokens > 0
        hit = new_computed_blocks or []
        blocks = self.req_to_blocks.setdefault(req.request_id, [])
        assert not (hit and blocks), "prefix hits only for a request that owns no blocks"
        num_computed = req.num_computed_tokens + len(hit) * self.block_size
        num_new_blocks = cdiv(num_computed + num_new_tokens, self.block_size) - len(blocks) - len(hit)
        num_evictable_hits = sum(1 for b in hit if b.ref_cnt == 0)  # touching them takes them off the free queue
        if num_new_blocks + num_evictable_hits > self.gpu_pool.num_free_blocks:
            if not blocks:
                del self.req_to_blocks[req.request_id]
            return None
        assert num_new_blocks >= 0, f"{req.request_id} owns more blocks than its tokens need"
        self.gpu_pool.touch(hit)
        blocks.extend(hit)
        new_blocks = self.gpu_pool.get_new_blocks(num_new_blocks)
        blocks.extend(new_blocks)
        num_cached = self._num_cached_blocks.get(req.request_id, 0) + len(hit)
        num_full = min((num_computed + num_new_tokens) // self.block_size, len(req.block_hashes))
        self.gpu_pool.cache_full_blocks(blocks, req.block_hashes, num_cached, num_full)
        self._num_cached_blocks[req.request_id] = max(num_cached, num_full)
        return new_blocks

    def free(self, req: Request) -> None:
        """Release every block the request holds, device and CPU, tail-first (its prefix is evicted last)."""
        self._num_cached_blocks.pop(req.request_id, None)
        self.gpu_pool.free_blocks(reversed(self.req_to_blocks.pop(req.request_id, [])))
        self.cpu_pool.free_blocks(reversed(self.req_to_cpu_blocks.pop(req.request_id, [])))

    def can_swap_out(self, req: Request) -> bool:
        return len(self.req_to_blocks.get(req.request_id, ())) <= self.cpu_pool.num_free_blocks

    def swap_out(self, req: Request) -> list[tuple[int, int]]:
        """Move the request's blocks to fresh CPU blocks; returns the (gpu_block, cpu_block) copies to run."""
        gpu_blocks = self.req_to_blocks.pop(req.request_id)
        cpu_blocks = self.cpu_pool.get_new_blocks(len(gpu_blocks))
        self.req_to_cpu_blocks[req.request_id] = cpu_blocks
        self._num_cached_blocks.pop(req.request_id, None)
        self.gpu_pool.free_blocks(reversed(gpu_blocks))
        return [(g.block_id, c.block_id) for g, c in zip(gpu_blocks, cpu_blocks)]

    def can_swap_in(self, req: Request, num_new_tokens: int = 0) -> bool:
        """Room for the swapped blocks plus the blocks num_new_tokens more will need."""
        needed = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size)
        return needed <= self.gpu_pool.num_free_blocks

    def swap_in(self, req: Request) -> list[tuple[int, int]]:
        """Move the request's CPU blocks to fresh device blocks; returns the (cpu_block, gpu_block) copies.
        The full ones are hashed again (their K/V lands before this step's forward reads it)."""
        cpu_blocks = self.req_to_cpu_blocks.pop(req.request_id)
        gpu_blocks = self.gpu_pool.get_new_blocks(len(cpu_blocks))
        self.req_to_blocks[req.request_id] = gpu_blocks
        num_full = min(req.num_computed_tokens // self.block_size, len(req.block_hashes))
        self.gpu_pool.cache_full_blocks(gpu_blocks, req.block_hashes, 0, num_full)
        self._num_cached_blocks[req.request_id] = num_full
        self.cpu_pool.free_blocks(reversed(cpu_blocks))
        return [(c.block_id, g.block_id) for c, g in zip(cpu_blocks, gpu_blocks)]
