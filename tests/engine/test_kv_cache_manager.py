"""KVCacheManager: prefix hits, allocation, free order, swap pairs (design §4.4, §4.7)."""

from __future__ import annotations

from edgellm.engine.kv_cache_manager import KVCacheManager
from edgellm.engine.request import Request
from edgellm.engine.sampling_params import SamplingParams


def make_request(req_id: str, token_ids: list[int]) -> Request:
    return Request(req_id, token_ids, SamplingParams(), eos_token_id=None, block_size=16)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


PREFIX = list(range(48))  # three full blocks


def run_prefill(kv: KVCacheManager, req: Request) -> list[int]:
    hit, hit_tokens = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - hit_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    return kv.get_block_ids(req)


def test_prefix_hit_of_three_blocks():
    kv = KVCacheManager(num_gpu_blocks=10, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", PREFIX + [100, 101, 102])
    assert run_prefill(kv, a) == [1, 2, 3, 4]
    b = make_request("b", PREFIX + [200, 201])
    hit, hit_tokens = kv.get_computed_blocks(b)
    assert ids(hit) == [1, 2, 3] and hit_tokens == 48
    new = kv.allocate_slots(b, b.num_tokens - 48, hit)
    assert ids(new) == [5]
    assert kv.get_block_ids(b) == [1, 2, 3, 5]
    assert [blk.ref_cnt for blk in kv.gpu_pool.blocks[1:6]] == [2, 2, 2, 1, 1]


def test_prefix_hit_survives_free_and_is_capped_at_num_tokens_minus_one():
    kv = KVCacheManager(num_gpu_blocks=10, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", PREFIX)
    assert run_prefill(kv, a) == [1, 2, 3]
    kv.free(a)
    assert kv.gpu_pool.free_block_queue.block_ids() == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    same = make_request("same", PREFIX)  # the whole prompt is cached, but one token must be computed
    hit, hit_tokens = kv.get_computed_blocks(same)
    assert ids(hit) == [1, 2] and hit_tokens == 32
    longer = make_request("longer", PREFIX + [7])
    hit, hit_tokens = kv.get_computed_blocks(longer)
    assert ids(hit) == [1, 2, 3] and hit_tokens == 48
    assert kv.allocate_slots(longer, 1, hit) is not None
    assert kv.gpu_pool.free_block_queue.block_ids() == [5, 6, 7, 8, 9]  # hits left the queue, 4 was taken


def test_allocate_slots_none_when_short_and_nothing_changes():
    kv = KVCacheManager(num_gpu_blocks=4, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", list(range(40)))  # 3 blocks
    assert ids(kv.allocate_slots(a, 40)) == [1, 2, 3]
    b = make_request("b", list(range(100, 110)))
    assert kv.allocate_slots(b, 10) is None
    assert kv.get_block_ids(b) == [] and kv.num_free_blocks == 0
    a.num_computed_tokens = 40
    a.append_output_token_ids([5] * 9)  # 49 tokens: the next one needs a 4th block
    assert kv.allocate_slots(a, 8) == []  # tokens 40..47 still fit in block 3
    a.num_computed_tokens = 48
    assert kv.allocate_slots(a, 1) is None


def test_allocation_hashes_blocks_full_after_this_step():
    kv = KVCacheManager(num_gpu_blocks=10, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", list(range(40)))
    kv.allocate_slots(a, 20)  # chunk: tokens 0..19, block 1 becomes full
    assert [b.block_hash for b in kv.gpu_pool.blocks[1:3]] == [a.block_hashes[0], None]
    a.num_computed_tokens = 20
    kv.allocate_slots(a, 20)  # tokens 20..39: block 2 full, block 3 partial
    assert [b.block_hash for b in kv.gpu_pool.blocks[1:4]] == [a.block_hashes[0], a.block_hashes[1], None]


def test_free_is_tail_first():
    kv = KVCacheManager(num_gpu_blocks=6, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", list(range(40)))
    run_prefill(kv, a)
    kv.free(a)  # 3 (partial, unhashed) to the head; 2 then 1 to the tail
    assert kv.gpu_pool.free_block_queue.block_ids() == [3, 4, 5, 2, 1]
    assert kv.get_block_ids(a) == []


def test_swap_out_and_in_pairs_exact_and_cpu_pool_empties():
    kv = KVCacheManager(num_gpu_blocks=8, num_cpu_blocks=5, block_size=16, enable_caching=True)
    a = make_request("a", list(range(40)))
    assert run_prefill(kv, a) == [1, 2, 3]
    filler = make_request("filler", list(range(1000, 1016)))
    run_prefill(kv, filler)  # block 4
    assert kv.can_swap_out(a)
    assert kv.swap_out(a) == [(1, 1), (2, 2), (3, 3)]
    assert kv.get_block_ids(a) == [] and kv.cpu_pool.num_free_blocks == 1
    assert all(b.ref_cnt == 1 and b.block_hash is None for b in kv.cpu_pool.blocks[1:4])
    assert kv.gpu_pool.free_block_queue.block_ids() == [3, 5, 6, 7, 2, 1]
    assert kv.can_swap_out(filler)  # its one block fits in the one free CPU block
    assert kv.can_swap_in(a, 1)  # 3 blocks for 40 computed + 1 new
    assert kv.swap_in(a) == [(1, 3), (2, 5), (3, 6)]
    assert kv.get_block_ids(a) == [3, 5, 6]
    assert kv.cpu_pool.num_free_blocks == 4 and kv.cpu_usage == 0.0
    # full blocks are hashed again; the old copies (2, 1) are still cached too
    assert kv.gpu_pool.blocks[3].block_hash == a.block_hashes[0]
    assert kv.gpu_pool.blocks[5].block_hash == a.block_hashes[1]
    assert set(kv.gpu_pool.cached_blocks[a.block_hashes[0]]) == {1, 3}
    assert kv.allocate_slots(a, 1) == []  # token 40 fits in block 6


def test_swap_in_needs_room_for_new_tokens():
    kv = KVCacheManager(num_gpu_blocks=5, num_cpu_blocks=5, block_size=16, enable_caching=False)
    a = make_request("a", list(range(48)))
    run_prefill(kv, a)
    kv.swap_out(a)
    b = make_request("b", list(range(100, 116)))
    run_prefill(kv, b)  # 1 block taken: 3 free
    assert kv.can_swap_in(a, 0)
    assert not kv.can_swap_in(a, 1)  # token 48 opens a 4th block


def test_no_swap_space():
    kv = KVCacheManager(num_gpu_blocks=4, num_cpu_blocks=0, block_size=16, enable_caching=True)
    a = make_request("a", list(range(10)))
    run_prefill(kv, a)
    assert not kv.can_swap_out(a)
