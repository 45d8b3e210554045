"""BlockPool: exact ids, ref counts, free-queue order, lazy eviction, null block (design §4.2)."""

from __future__ import annotations

import random

from edgellm.engine.block_pool import BlockPool, FreeBlockQueue, KVBlock
from edgellm.engine.request import ROOT_HASH, hash_block_tokens


def h(i: int) -> bytes:
    return hash_block_tokens(ROOT_HASH, [i] * 16)


def ids(blocks: list[KVBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def check_invariants(pool: BlockPool) -> None:
    free_ids = pool.free_block_queue.block_ids()
    assert 0 not in free_ids and pool.null_block.ref_cnt == 0 and pool.null_block.block_hash is None
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
    for block in pool.blocks[1:]:
        assert (block.block_id in free_ids) == (block.ref_cnt == 0), block
    in_use = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
    assert pool.num_free_blocks + in_use == pool.num_blocks - 1
    mapped = {(bh, bid) for bh, hits in pool.cached_blocks.items() for bid in hits}
    hashed = {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
    assert mapped == hashed
    assert all(hits for hits in pool.cached_blocks.values())


def test_free_block_queue_o1_ops():
    blocks = [KVBlock(i) for i in range(6)]
    q = FreeBlockQueue(blocks[1:])
    assert q.block_ids() == [1, 2, 3, 4, 5] and q.num_free_blocks == 5
    q.remove(blocks[3])
    assert q.block_ids() == [1, 2, 4, 5]
    assert q.popleft() is blocks[1]
    q.appendleft(blocks[3])
    q.append(blocks[1])
    assert q.block_ids() == [3, 2, 4, 5, 1] and q.num_free_blocks == 5
    assert blocks[3].prev is not None and blocks[0].prev is None


def test_new_blocks_exact_ids_and_null_block_never_handed_out():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    assert pool.num_free_blocks == 4 and pool.free_block_queue.block_ids() == [1, 2, 3, 4]
    got = pool.get_new_blocks(4)
    assert ids(got) == [1, 2, 3, 4]
    assert [b.ref_cnt for b in got] == [1, 1, 1, 1]
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    assert pool.null_block.block_id == 0 and pool.null_block.ref_cnt == 0
    check_invariants(pool)


def test_ref_counts_and_tail_first_free_order():
    pool = BlockPool(num_blocks=8, enable_caching=True)
    a = pool.get_new_blocks(3)  # 1, 2, 3
    b = pool.get_new_blocks(2)  # 4, 5
    pool.cache_full_blocks(a, [h(1), h(2)], 0, 2)  # 1, 2 full and hashed; 3 partial
    pool.touch(a[:2])  # a second request shares the prefix
    assert [x.ref_cnt for x in a] == [2, 2, 1]
    pool.free_blocks(reversed(a))  # first owner leaves, tail first: only block 3 reaches 0
    assert [x.ref_cnt for x in a] == [1, 1, 0]
    assert pool.free_block_queue.block_ids() == [3, 6, 7]  # unhashed block goes to the head
    pool.free_blocks(reversed(a[:2]))  # second owner leaves: 2 then 1, hashed -> tail
    assert pool.free_block_queue.block_ids() == [3, 6, 7, 2, 1]
    pool.free_blocks(reversed(b))  # unhashed 5, 4 -> head, keeping the tail-first order
    assert pool.free_block_queue.block_ids() == [5, 4, 3, 6, 7, 2, 1]
    check_invariants(pool)


def test_prefix_hit_after_free_then_lazy_eviction_on_reuse():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)  # 1, 2
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_queue.block_ids() == [3, 2, 1]
    assert pool.get_cached_block(h(1)) is blocks[0]  # freed but not forgotten
    assert pool.get_cached_block(h(2)) is blocks[1]
    pool.touch([blocks[0]])  # hit: taken out of the middle of the queue
    assert blocks[0].ref_cnt == 1 and pool.free_block_queue.block_ids() == [3, 2]
    got = pool.get_new_blocks(2)  # pops 3 then 2; 2 loses its hash now
    assert ids(got) == [3, 2]
    assert pool.get_cached_block(h(2)) is None and blocks[1].block_hash is None
    assert pool.get_cached_block(h(1)) is blocks[0]
    check_invariants(pool)


def test_same_hash_twice_is_not_deduplicated():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    a, b = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [h(9)], 0, 1)
    pool.cache_full_blocks(b, [h(9)], 0, 1)
    assert set(pool.cached_blocks[h(9)]) == {1, 2}
    pool.free_blocks(a)
    pool.free_blocks(b)
    assert ids(pool.get_new_blocks(2)) == [3, 1]
    assert pool.get_cached_block(h(9)) is b[0]
    check_invariants(pool)


def test_caching_disabled_never_hashes():
    pool = BlockPool(num_blocks=3, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2)
    assert pool.cached_blocks == {} and all(b.block_hash is None for b in blocks)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_queue.block_ids() == [2, 1]
    check_invariants(pool)


def test_random_op_sequences_keep_invariants():
    rng = random.Random(0)
    for _ in range(20):
        pool = BlockPool(num_blocks=rng.randint(2, 12), enable_caching=True)
        owners: list[list[KVBlock]] = []  # each a request's block table
        for _ in range(200):
            op = rng.random()
            if op < 0.4 and pool.num_free_blocks:
                table = pool.get_new_blocks(rng.randint(1, pool.num_free_blocks))
                nfull = rng.randint(0, len(table))
                pool.cache_full_blocks(table, [h(rng.randint(0, 5)) for _ in table], 0, nfull)
                owners.append(table)
            elif op < 0.6 and pool.cached_blocks:
                hit = pool.get_cached_block(rng.choice(list(pool.cached_blocks)))
                pool.touch([hit])
                owners.append([hit])
            elif owners:
                pool.free_blocks(reversed(owners.pop(rng.randrange(len(owners)))))
            check_invariants(pool)
            refs = [0] * pool.num_blocks
            for table in owners:
                for b in table:
                    refs[b.block_id] += 1
            assert refs == [b.ref_cnt for b in pool.blocks]
