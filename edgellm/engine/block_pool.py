"""KVBlock, FreeBlockQueue, BlockPool: the KV blocks of one device, their ref counts and the prefix cache.

    blocks:      [0:null] [1] [2] [3] [4] [5] [6] [7] ...   KVBlock(block_id, ref_cnt, block_hash, prev, next)
    free queue:  head -> 5 <-> 9 <-> 3 <-> 7 <- tail           evict from the head, intrusive list, O(1) remove
    hash map:    {h(a): {3: blk3}, h(ab): {7: blk7}, ...}       cached full blocks, free or in use

Invariants (design §4.2):
1. Block 0 is the null block: never handed out, never freed, never in the free
   queue; padding rows of block tables point at it.
2. Among blocks 1..N-1, a block is in the free queue <=> ref_cnt == 0, so
   num_free + #(ref_cnt > 0) == num_blocks - 1.
3. Freeing does not forget: a freed full block keeps its hash and stays in the
   hash map while it waits in the free queue; `get_new_blocks` drops the hash
   only when it pops the block for reuse (lazy eviction). A finished turn's
   prefix can therefore be hit by the next turn.
4. Eviction order: callers free a request's blocks tail-first. Freed blocks
   without a hash (a partial last block: worthless to the cache) go to the head,
   hashed ones to the tail, so the chain's end is evicted before its start.
5. `touch` on a cache hit takes a free block out of the queue (O(1)) and then
   bumps ref_cnt.
6. No de-duplication: two blocks may carry the same hash (one filled while the
   other was cached); block tables are append-only, so a running request's
   block ids never change. A hash maps to {block_id: block}; a hit takes any.

With enable_caching=False (the CPU swap pool) nothing is ever hashed.
Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgellm.engine.request import BlockHash


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # requests whose block table holds this block
        self.block_hash: BlockHash | None = None  # set once full and cached; cleared on reuse
        self.prev: KVBlock | None = None  # free-queue links; None when not in the queue
        self.next: KVBlock | None = None

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    def __repr__(self) -> str:
        h = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hash={h})"


class FreeBlockQueue:
    """Doubly linked list threaded through the blocks themselves.

    Not a `collections.deque`: a prefix hit must pull a block out of the
    middle in O(1) (vLLM `FreeKVCacheBlockQueue`). Two sentinels remove the
    empty-list special cases.
    """

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        block = self._head.next
        assert block is not self._tail, "pop from an empty free queue"
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        assert block.prev is not None and block.next is not None, f"{block} is not in the free queue"
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        self._link(block, self._tail.prev, self._tail)

    def appendleft(self, block: KVBlock) -> None:
        self._link(block, self._head, self._head.next)

    def _link(self, block: KVBlock, prev: KVBlock, nxt: KVBlock) -> None:
        assert block.prev is None and block.next is None, f"{block} is already in the free queue"
        block.prev, block.next = prev, nxt
        prev.next = nxt.prev = block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Head (evicted first) to tail."""
        ids, block = [], self._head.next
        while block is not self._tail:
            ids.append(block.block_id)
            block = block.next
        return ids


class BlockPool:
    """Owns num_blocks KVBlocks (block 0 the null block), the free queue and the hash map."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        assert num_blocks >= 1, "a pool holds at least the null block"
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_block_queue = FreeBlockQueue(self.blocks[1:])
        self.cached_blocks: dict[BlockHash, dict[int, KVBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) held by requests."""
        usable = self.num_blocks - 1
        return 1.0 - self.num_free_blocks / usable if usable else 0.0

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        hits = self.cached_blocks.get(block_hash)
        return next(iter(hits.values())) if hits else None

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take hit blocks for one more request: out of the free queue if unreferenced, then ref_cnt += 1."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Pop num_blocks from the head of the free queue, evicting their cached hashes; each gets ref_cnt 1."""
        assert num_blocks <= self.num_free_blocks, f"need {num_blocks} blocks, {self.num_free_blocks} free"
        blocks = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; those reaching 0 rejoin the queue (invariant 4).

        `ordered_blocks` is the eviction order the caller wants, first evicted
        first (a request passes its blocks tail-first).
        """
        unhashed, hashed = [], []
        for block in ordered_blocks:
            assert not block.is_null and block.ref_cnt > 0, f"freeing {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                (hashed if block.block_hash is not None else unhashed).append(block)
        for block in reversed(unhashed):
            self.free_block_queue.appendleft(block)
        for block in hashed:
            self.free_block_queue.append(block)

    def cache_full_blocks(
        self, blocks: list[KVBlock], block_hashes: list[BlockHash], num_cached_blocks: int, num_full_blocks: int
    ) -> None:
        """Hash blocks[num_cached_blocks:num_full_blocks] of one request into the map (they are, or will be
        this step, full). Blocks before num_cached_blocks are already cached."""
        if not self.enable_caching:
            return
        assert num_full_blocks <= min(len(blocks), len(block_hashes)), "caching a block that is not full"
        new = slice(num_cached_blocks, num_full_blocks)
        for block, block_hash in zip(blocks[new], block_hashes[new]):
            assert block.block_hash is None, f"{block} is cached twice"
            block.block_hash = block_hash
            self.cached_blocks.setdefault(block_hash, {})[block.block_id] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        hits = self.cached_blocks[block.block_hash]
        del hits[block.block_id]
        if not hits:
            del self.cached_blocks[block.block_hash]
        block.block_hash = None
