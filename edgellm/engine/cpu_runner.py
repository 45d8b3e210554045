"""CpuModelRunner: SchedulerOutput -> forward over a flat batch -> sampled tokens (design §5.1, §5.4).

The runner keeps per-request state from the NewRequestData that introduces a
request until its id comes back in `finished_req_ids`; later steps bring only
diffs (new block ids, computed counts). Inside `execute`, in this order:

    1. drop finished requests           2. swap-out copies (device -> CPU pool)
    3. swap-in copies (CPU -> device)   4. apply new / cached request data
    5. build the flat batch             6. forward, logits at the sampled rows only, sample

Flat batch of request i with c_i computed and n_i scheduled tokens (all numpy):

    input_ids      token_ids[c_i : c_i + n_i], concatenated                 [T]
    positions      c_i .. c_i + n_i - 1                                      [T]
    query_start    0, n_0, n_0 + n_1, ...                                    [R + 1]
    seq_lens       c_i + n_i                                                 [R]
    block_tables   block ids per request, padded with the null block 0     [R, max_blocks]
    slot_mapping   block_table[i, pos // block_size] * block_size + pos % block_size   [T]
    logits_index   query_start[i + 1] - 1 for each request whose prompt is fully computed after
                   this step (a partial prefill chunk samples nothing)

No CUDA graphs and no pinned memory on the CPU; the model's reference kernels gather
K/V through the block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from edgellm.engine.kv_cache import KVCache, swap_blocks
from edgellm.engine.sampler import Sampler, SamplerOutput, SamplingMetadata
from edgellm.engine.sampling_params import SamplingParams
from edgellm.engine.sched_output import RunnerOutput, SchedulerOutput, TokenLogprobs
from edgellm.model.forward_context import ForwardContext
from edgellm.model.llama import CausalLM


@dataclass(slots=True)
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt, then every token this runner sampled for it
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]  # the request's block table row
    num_computed_tokens: int  # tokens in the cache before the current step
    generator: torch.Generator | None  # its own RNG when the request has a seed


@dataclass(slots=True)
class FlatBatch:
    input_ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    query_start_loc: np.ndarray  # int64 [R + 1]
    seq_lens: np.ndarray  # int64 [R]
    block_tables: np.ndarray  # int64 [R, max_blocks]
    slot_mapping: np.ndarray  # int64 [T]
    logits_index: np.ndarray  # int64 [S]: flat rows whose logits are sampled
    sampled_reqs: list[int]  # [S]: which of the R requests each sampled row belongs to


def build_flat_batch(reqs: list[CachedRequestState], num_scheduled: list[int], block_size: int) -> FlatBatch:
    """The flat batch of one step (table at the top of this module); pure numpy, no model."""
    R = len(reqs)
    counts = np.asarray(num_scheduled, dtype=np.int64)
    query_start = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(counts, out=query_start[1:])
    computed = np.array([r.num_computed_tokens for r in reqs], dtype=np.int64)
    seq_lens = computed + counts
    # positions: c_i + (flat index - query_start_i), one vector op for the whole batch
    positions = np.arange(query_start[-1], dtype=np.int64) - np.repeat(query_start[:-1] - computed, counts)
    input_ids = np.concatenate(
        [np.asarray(r.token_ids[c : c + n], dtype=np.int64) for r, c, n in zip(reqs, computed, counts)]
    ) if R else np.zeros(0, dtype=np.int64)
    max_blocks = max((len(r.block_ids) for r in reqs), default=0)
    block_tables = np.zeros((R, max_blocks), dtype=np.int64)
    for i, r in enumerate(reqs):
        block_tables[i, : len(r.block_ids)] = r.block_ids
    row_of_token = np.repeat(np.arange(R), counts)
    slot_mapping = block_tables[row_of_token, positions // block_size] * block_size + positions % block_size
    sampled_reqs = [i for i, r in enumerate(reqs) if seq_lens[i] >= len(r.token_ids)]
    logits_index = query_start[1:][sampled_reqs] - 1
    return FlatBatch(input_ids, positions, query_start, seq_lens, block_tables, slot_mapping, logits_index, sampled_reqs)


class CpuModelRunner:
    def __init__(self, model: CausalLM, kv_cache: KVCache, swap_cache: KVCache, block_size: int, seed: int,
                 eos_token_id: int | None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.swap_cache = swap_cache
        self.block_size = block_size
        self.device = next(model.parameters()).device
        self.sampler = Sampler(torch.Generator(device=self.device).manual_seed(seed), eos_token_id)
        self.requests: dict[str, CachedRequestState] = {}

    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        for req_id in sched.finished_req_ids:
            self.requests.pop(req_id, None)
        # Swap-outs first: a device block they free may be reused by this step's forward.
        swap_blocks(self.kv_cache, self.swap_cache, sched.blocks_to_swap_out)
        swap_blocks(self.swap_cache, self.kv_cache, sched.blocks_to_swap_in)
        self._update_states(sched)
        req_ids = list(sched.num_scheduled_tokens)
        if not req_ids:
            return RunnerOutput([], [])
        reqs = [self.requests[r] for r in req_ids]
        batch = build_flat_batch(reqs, [sched.num_scheduled_tokens[r] for r in req_ids], self.block_size)
        sampled = self._forward_and_sample(reqs, batch)

        sampled_token_ids: list[list[int]] = [[] for _ in req_ids]
        logprobs: list[list[TokenLogprobs] | None] | None = None
        if sampled is None:  # only partial prefill chunks this step
            return RunnerOutput(req_ids, sampled_token_ids)
        if sampled.logprobs is not None:
            logprobs = [None] * len(req_ids)
        for row, i in enumerate(batch.sampled_reqs):
            token = sampled.token_ids[row]
            reqs[i].token_ids.append(token)  # the scheduler accepts it too: this request has caught up
            sampled_token_ids[i] = [token]
            if logprobs is not None and sampled.logprobs[row] is not None:
                ids, lps = sampled.logprobs[row]
                logprobs[i] = [TokenLogprobs(ids, lps)]
        return RunnerOutput(req_ids, sampled_token_ids, logprobs)

    def _update_states(self, sched: SchedulerOutput) -> None:
        for new in sched.new_reqs:
            seed = new.sampling_params.seed
            gen = None if seed is None else torch.Generator(device=self.device).manual_seed(seed)
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, list(new.prompt_token_ids), len(new.prompt_token_ids), new.sampling_params,
                list(new.block_ids), new.num_computed_tokens, gen,
            )
        c = sched.cached_reqs
        for req_id, block_ids, num_computed, resumed in zip(c.req_ids, c.new_block_ids, c.num_computed_tokens, c.resumed):
            state = self.requests[req_id]
            state.block_ids = list(block_ids) if resumed else state.block_ids + block_ids
            state.num_computed_tokens = num_computed

    def _forward_and_sample(self, reqs: list[CachedRequestState], batch: FlatBatch) -> SamplerOutput | None:
        def t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(a).to(self.device)

        ctx = ForwardContext(t(batch.slot_mapping), t(batch.block_tables), t(batch.seq_lens),
                             t(batch.query_start_loc), self.kv_cache.layers)
        hidden = self.model.forward_flat(t(batch.input_ids), t(batch.positions), ctx)  # [T, H]
        if not batch.sampled_reqs:
            return None
        logits = self.model.compute_logits(hidden[t(batch.logits_index)])  # [S, V]
        rows = [reqs[i] for i in batch.sampled_reqs]
        meta = SamplingMetadata(
            params=[r.sampling_params for r in rows],
            generators=[r.generator for r in rows],
            token_ids=[r.token_ids for r in rows],
            num_prompt_tokens=[r.num_prompt_tokens for r in rows],
        )
        return self.sampler(logits, meta)
