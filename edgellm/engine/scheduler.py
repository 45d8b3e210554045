"""Scheduler: the queues, the token budget and preemption. Decides what each step computes.

    add_request ──► waiting ──admit──► running ──finish──► freed, id in next finished_req_ids
                      ▲                  │  ▲
                      └───recompute──────┤  │
                    swapped ◄───swap─────┘  │
                       └─────swap in────────┘      (swapped is served before waiting)

There is no prefill or decode phase (vLLM V1): every request has
num_computed_tokens catching up with num_tokens, and one step hands out up to
max_num_batched_tokens of that gap. A fresh prompt, a chunk of a long prompt,
a resumed request and a decode are the same operation with different counts.
Invariants asserted at the end of every schedule(): the budget holds,
len(running) <= max_num_seqs, each scheduled request owns exactly
ceil(num_computed_tokens / block_size) blocks, no request sits in two queues, a
swapped request owns no device blocks, the CPU pool is empty when none is
swapped, and a step never both swaps out and swaps in (so a CPU block freed by
a swap-in is never overwritten by a swap-out copy of the same step).
Pure Python: no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from edgellm.config import CacheConfig, SchedulerConfig
from edgellm.engine.kv_cache_manager import KVCacheManager, cdiv
from edgellm.engine.request import Request, RequestStatus
from edgellm.engine.sched_output import (
    CachedRequestData,
    EngineCoreOutput,
    NewRequestData,
    RunnerOutput,
    SchedulerOutput,
)


class Scheduler:
    def __init__(
        self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_gpu_blocks: int, num_cpu_blocks: int
    ) -> None:
        if scheduler_config.max_model_len is None:
            raise ValueError("SchedulerConfig.max_model_len: expected an integer, got None; set it from the model")
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.max_model_len = scheduler_config.max_model_len
        fit_tokens = (num_gpu_blocks - 1) * self.block_size
        if fit_tokens < self.max_model_len:
            raise ValueError(
                f"KV cache: {num_gpu_blocks - 1} blocks hold {fit_tokens} tokens < max_model_len "
                f"{self.max_model_len}; lower --max-model-len or raise --gpu-memory-utilization"
            )
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks, num_cpu_blocks, self.block_size, cache_config.enable_prefix_caching
        )
        self.requests: dict[str, Request] = {}  # every unfinished request by id
        self.waiting: deque[Request] = deque()  # never scheduled, or preempted by recompute (at the front)
        self.running: list[Request] = []  # owns device blocks, in admission order
        self.swapped: deque[Request] = deque()  # blocks in the CPU pool, oldest first
        self.finished_req_ids: set[str] = set()  # finished since the last schedule(), for the runner
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_recompute_preemptions = 0
        self.num_prefix_cached_tokens = 0  # prompt tokens served from the prefix cache, all requests

    def add_request(self, req: Request) -> None:
        if req.num_prompt_tokens > self.max_model_len:
            n, limit = req.num_prompt_tokens, self.max_model_len
            raise ValueError(f"request {req.request_id}: prompt has {n} tokens > max_model_len {limit}")
        if req.request_id in self.requests:
            raise ValueError(f"request {req.request_id}: id already in use")
        assert req.block_size == self.block_size and req.status == RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def schedule(self) -> SchedulerOutput:
        """One step: (1) RUNNING in order, preempting from the back when blocks run short; (2) only if no one
        was preempted, SWAPPED then WAITING, FCFS, while budget and seats last; (3) advance num_computed_tokens."""
        kv = self.kv_cache_manager
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        budget = self.config.max_num_batched_tokens

        # 1. RUNNING. Victims come from the back, which is never before req, so no scheduled request is evicted.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while (new_blocks := kv.allocate_slots(req, n)) is None:
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    break
            if new_blocks is None:
                break
            self._add_cached(out, req, [b.block_id for b in new_blocks], resumed=False)
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n
            i += 1

        # 2. SWAPPED before WAITING, so nobody new takes the blocks a swapped request waits for.
        if not out.preempted_req_ids:
            while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.swapped[0]
                n = min(req.num_tokens - req.num_computed_tokens, budget)
                if not kv.can_swap_in(req, n):
                    break
                self.swapped.popleft()
                out.blocks_to_swap_in.extend(kv.swap_in(req))
                new_blocks = kv.allocate_slots(req, n)
                assert new_blocks is not None, "can_swap_in promised room"
                self.num_swap_ins += 1
                self._admit(out, req, n)
                budget -= n
            while not self.swapped and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.waiting[0]
                assert req.num_computed_tokens == 0
                hit_blocks, hit_tokens = kv.get_computed_blocks(req)
                n = min(req.num_tokens - hit_tokens, budget)
                if kv.allocate_slots(req, n, hit_blocks) is None:
                    break
                self.waiting.popleft()
                req.num_computed_tokens = hit_tokens
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = hit_tokens
                    self.num_prefix_cached_tokens += hit_tokens
                self._admit(out, req, n)
                budget -= n

        # 3. Advance optimistically: the runner computes exactly these tokens this step.
        for req_id, n in out.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        self._check_invariants(out)
        return out

    def _admit(self, out: SchedulerOutput, req: Request, n: int) -> None:
        """Seat a request from swapped or waiting; a preempted one is resumed with its whole new block row."""
        block_ids = self.kv_cache_manager.get_block_ids(req)
        if req.status == RequestStatus.WAITING:
            new = NewRequestData(
                req.request_id, req.prompt_token_ids, req.sampling_params, block_ids, req.num_computed_tokens
            )
            out.new_reqs.append(new)
        else:
            self._add_cached(out, req, block_ids, resumed=True)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        out.num_scheduled_tokens[req.request_id] = n

    @staticmethod
    def _add_cached(out: SchedulerOutput, req: Request, block_ids: list[int], resumed: bool) -> None:
        c: CachedRequestData = out.cached_reqs
        c.req_ids.append(req.request_id)
        c.new_block_ids.append(block_ids)
        c.num_computed_tokens.append(req.num_computed_tokens)
        c.resumed.append(resumed)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Swap to the CPU pool if it has room (keeps the computed tokens), else recompute later (drop the
        blocks; the prefix cache makes the redo cheap). Victims arrive newest first, so pushing each to the
        front of its queue keeps the oldest first."""
        kv = self.kv_cache_manager
        req.num_preemptions += 1
        out.preempted_req_ids.add(req.request_id)
        if req.num_computed_tokens >= self.config.swap_min_tokens and kv.can_swap_out(req):
            out.blocks_to_swap_out.extend(kv.swap_out(req))
            req.status = RequestStatus.SWAPPED
            self.swapped.appendleft(req)
            self.num_swap_outs += 1
        else:
            kv.free(req)
            req.num_computed_tokens = 0
            req.status = RequestStatus.PREEMPTED
            self.waiting.appendleft(req)
            self.num_recompute_preemptions += 1

    def update_from_output(self, sched_out: SchedulerOutput, runner_out: RunnerOutput) -> list[EngineCoreOutput]:
        """Accept each sampled token of a request that has caught up (computed == num_tokens; a partial
        prefill's sample is dropped), check stop conditions, free the finished."""
        index = {req_id: i for i, req_id in enumerate(runner_out.req_ids)}
        outputs = []
        for req_id in sched_out.num_scheduled_tokens:
            req = self.requests.get(req_id)
            if req is None or req.num_computed_tokens < req.num_tokens:
                continue  # finished (aborted) since schedule(), or still in prefill
            i = index[req_id]
            new_token_ids = []
            for token_id in runner_out.sampled_token_ids[i]:
                req.append_output_token_ids(token_id)
                new_token_ids.append(token_id)
                if self._check_stop(req):
                    break
            logprobs = runner_out.logprobs[i] if runner_out.logprobs is not None else None
            if logprobs is not None:
                logprobs = logprobs[: len(new_token_ids)]
            outputs.append(
                EngineCoreOutput(
                    req_id, new_token_ids, req.status.finish_reason, logprobs, req.num_cached_tokens, req.stop_reason
                )
            )
            if req.is_finished:
                self._free(req)
        if any(r.is_finished for r in self.running):
            self.running = [r for r in self.running if not r.is_finished]
        return outputs

    def _check_stop(self, req: Request) -> bool:
        """Stop token conditions after one appended token. EOS and stop ids count only once min_tokens are out
        (and EOS not under ignore_eos); they win over length when both hold."""
        sp = req.sampling_params
        last = req.output_token_ids[-1]
        if req.num_output_tokens >= sp.min_tokens:
            if last == req.eos_token_id and not sp.ignore_eos:
                req.status = RequestStatus.FINISHED_STOPPED
            elif last in sp.stop_token_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = last
        max_tokens_out = sp.max_tokens is not None and req.num_output_tokens >= sp.max_tokens
        if not req.is_finished and (req.num_tokens >= self.max_model_len or max_tokens_out):
            req.status = RequestStatus.FINISHED_LENGTH
        return req.is_finished

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish requests from outside the step (abort, stop string): their blocks are freed at once and the
        runner hears of it in the next output. Unknown or already finished ids are ignored."""
        assert status.is_finished
        for req_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            req = self.requests.get(req_id)
            if req is None:
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            elif req.status == RequestStatus.SWAPPED:
                self.swapped.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free(req)

    def _free(self, req: Request) -> None:
        self.kv_cache_manager.free(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    def _check_invariants(self, out: SchedulerOutput) -> None:
        kv = self.kv_cache_manager
        assert out.total_num_scheduled_tokens <= self.config.max_num_batched_tokens
        assert len(self.running) <= self.config.max_num_seqs
        for req_id in out.num_scheduled_tokens:
            req = self.requests[req_id]
            assert len(kv.get_block_ids(req)) == cdiv(req.num_computed_tokens, self.block_size), req
        queued = [r.request_id for q in (self.waiting, self.running, self.swapped) for r in q]
        assert len(queued) == len(set(queued)) == len(self.requests)
        assert all(not kv.get_block_ids(r) for r in self.swapped)
        assert self.swapped or kv.cpu_pool.num_free_blocks == kv.cpu_pool.num_blocks - 1
        assert not (out.blocks_to_swap_out and out.blocks_to_swap_in)
