"""The runner's flat batch on hand-written cases, paged attention against plain causal SDPA, swap copies."""

from __future__ import annotations

import pytest
import torch

from edgellm.engine.cpu_runner import CachedRequestState, build_flat_batch
from edgellm.engine.kv_cache import KVCache, swap_blocks
from edgellm.engine.sampling_params import SamplingParams
from edgellm.kernels import reference


def state(token_ids: list[int], num_prompt: int, block_ids: list[int], computed: int) -> CachedRequestState:
    return CachedRequestState("r", token_ids, num_prompt, SamplingParams(), block_ids, computed, None)


def test_flat_batch_mixed_prefill_chunk_decode():
    bs = 4
    reqs = [
        state(list(range(100, 106)), 6, [7, 2], 0),  # fresh prompt of 6, all scheduled
        state(list(range(200, 210)), 10, [3, 9, 5], 4),  # prompt of 10: chunk of 3 after 4 computed (partial)
        state(list(range(300, 306)), 5, [4, 8], 5),  # decode: 5 computed, 1 new output token
    ]
    b = build_flat_batch(reqs, [6, 3, 1], bs)
    assert b.input_ids.tolist() == [100, 101, 102, 103, 104, 105, 204, 205, 206, 305]
    assert b.positions.tolist() == [0, 1, 2, 3, 4, 5, 4, 5, 6, 5]
    assert b.query_start_loc.tolist() == [0, 6, 9, 10]
    assert b.seq_lens.tolist() == [6, 7, 6]
    assert b.block_tables.tolist() == [[7, 2, 0], [3, 9, 5], [4, 8, 0]]
    # block_table[row, pos // 4] * 4 + pos % 4
    assert b.slot_mapping.tolist() == [28, 29, 30, 31, 8, 9, 36, 37, 38, 33]
    assert b.logits_index.tolist() == [5, 9]  # the chunk (7 of 10 tokens) samples nothing
    assert b.sampled_reqs == [0, 2]


def test_flat_batch_resumed_after_prefix_hit():
    # 8 prefix-cached tokens (2 blocks), 3 left to compute; last block partially filled
    b = build_flat_batch([state(list(range(11)), 11, [5, 6, 1], 8)], [3], 4)
    assert b.positions.tolist() == [8, 9, 10]
    assert b.slot_mapping.tolist() == [4, 5, 6]
    assert b.logits_index.tolist() == [2]


def _scatter(cache: torch.Tensor, blocks: list[int], values: torch.Tensor) -> None:
    """Reference write: token t of a sequence to block blocks[t // bs], offset t % bs."""
    bs = cache.shape[1]
    for t in range(values.shape[0]):
        cache[blocks[t // bs], t % bs] = values[t]


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 4), (6, 1)])
def test_paged_attention_matches_causal_sdpa(hq, hkv):
    torch.manual_seed(0)
    D, bs, nb = 16, 4, 32
    k_cache = torch.zeros(nb, bs, hkv, D)
    v_cache = torch.zeros_like(k_cache)
    # (total length, computed before this step): prefill, decode, chunk, decode, prefill shorter than a block
    cases = [(9, 0), (6, 5), (13, 6), (17, 16), (3, 0)]
    tables = [[3, 7, 11], [1, 9], [2, 5, 12, 13], [4, 6, 8, 10, 14], [15]]
    seqs = [(torch.randn(L, hq, D), torch.randn(L, hkv, D), torch.randn(L, hkv, D)) for L, _ in cases]
    for (q, k, v), blocks, (L, c) in zip(seqs, tables, cases):
        _scatter(k_cache, blocks, k[:c])
        _scatter(v_cache, blocks, v[:c])
    states = [state(list(range(L)), L, blocks, c) for (L, c), blocks in zip(cases, tables)]
    b = build_flat_batch(states, [L - c for L, c in cases], bs)
    t = torch.from_numpy
    q = torch.cat([q[c:] for (q, _, _), (_, c) in zip(seqs, cases)])
    k = torch.cat([k[c:] for (_, k, _), (_, c) in zip(seqs, cases)])
    v = torch.cat([v[c:] for (_, _, v), (_, c) in zip(seqs, cases)])
    reference.write_kv(k_cache, v_cache, k, v, t(b.slot_mapping))
    out = reference.paged_attention(q, k_cache, v_cache, t(b.block_tables), t(b.seq_lens), t(b.query_start_loc), D**-0.5)
    expected = torch.cat(
        [reference.causal_attention(q[None], k[None], v[None], D**-0.5)[0, c:] for (q, k, v), (_, c) in zip(seqs, cases)]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("planned", [False, True], ids=["write_kv", "plan.write"])
def test_write_kv_skips_padding_slots(planned):
    k_cache = torch.zeros(4, 2, 1, 3)
    v_cache = torch.zeros_like(k_cache)
    k = torch.arange(1.0, 4.0).view(3, 1, 1).expand(3, 1, 3)
    slots = torch.tensor([5, -1, 2])  # the -1 row must land nowhere
    if planned:  # the engine's path: one plan per step, shared by the layers
        one = torch.tensor([1, 1, 1])
        plan = reference.PagedAttentionPlan.build(slots, torch.zeros(3, 1, dtype=torch.long), one,
                                                  torch.arange(4), block_size=2)
        plan.write(k_cache, v_cache, k, -k)
    else:
        reference.write_kv(k_cache, v_cache, k, -k, slots)
    expected = torch.zeros(8, 1, 3)
    expected[5], expected[2] = 1.0, 3.0
    assert torch.equal(k_cache.view(8, 1, 3), expected)
    assert torch.equal(v_cache.view(8, 1, 3), -expected)


def test_swap_blocks_round_trip():
    dev = KVCache(num_layers=2, num_blocks=6, block_size=2, num_kv_heads=1, head_dim=3, dtype=torch.float32, device="cpu",
                  zero=True)
    cpu = KVCache(num_layers=2, num_blocks=4, block_size=2, num_kv_heads=1, head_dim=3, dtype=torch.float32, device="cpu",
                  zero=False)
    for i, layer in enumerate(dev.layers):
        layer.copy_(torch.arange(layer.numel(), dtype=torch.float32).view_as(layer) + 1000 * i)
    before = [layer.clone() for layer in dev.layers]
    swap_blocks(dev, cpu, [(4, 1), (2, 3)])
    for layer, ref in zip(cpu.layers, before):
        assert torch.equal(layer[:, 1], ref[:, 4]) and torch.equal(layer[:, 3], ref[:, 2])
    swap_blocks(cpu, dev, [(1, 5), (3, 1)])
    for layer, ref in zip(dev.layers, before):
        assert torch.equal(layer[:, 5], ref[:, 4]) and torch.equal(layer[:, 1], ref[:, 2])
        assert torch.equal(layer[:, [0, 2, 3, 4]], ref[:, [0, 2, 3, 4]])  # untouched blocks stay


def test_block_bytes():
    # SmolLM2-135M in fp32: 30 layers x K,V x 16 tokens x 3 heads x 64 dims x 4 bytes
    assert KVCache.block_bytes(30, 16, 3, 64, torch.float32) == 30 * 2 * 16 * 3 * 64 * 4
    assert KVCache.block_bytes(1, 16, 1, 64, torch.float16) == 4096


def test_device_pool_starts_zeroed():
    # masked-out slots are still read by a padded decode group; a NaN there would poison SDPA
    kv = KVCache(num_layers=2, num_blocks=3, block_size=4, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                 device="cpu", zero=True)
    assert all(bool((layer == 0).all()) for layer in kv.layers)


def test_padded_decode_group_ignores_stale_slots():
    torch.manual_seed(1)
    D, bs = 8, 4
    k_cache = torch.full((6, bs, 1, D), 1e4)  # stale but finite contents everywhere
    v_cache = torch.full((6, bs, 1, D), -1e4)
    cases, tables = [(2, 1), (7, 6)], [[1], [2, 3]]  # a short and a long decode share one padded group
    seqs = [(torch.randn(L, 2, D), torch.randn(L, 1, D), torch.randn(L, 1, D)) for L, _ in cases]
    for (_, k, v), blocks in zip(seqs, tables):
        _scatter(k_cache, blocks, k)
        _scatter(v_cache, blocks, v)
    b = build_flat_batch([state(list(range(L)), L, bl, c) for (L, c), bl in zip(cases, tables)], [1, 1], bs)
    t = torch.from_numpy
    q = torch.stack([q[-1] for q, _, _ in seqs])
    out = reference.paged_attention(q, k_cache, v_cache, t(b.block_tables), t(b.seq_lens), t(b.query_start_loc), D**-0.5)
    expected = torch.stack([reference.causal_attention(q[None], k[None], v[None], D**-0.5)[0, -1] for q, k, v in seqs])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
