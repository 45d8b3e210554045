"""Scheduler against a fake runner, no torch (design §4.5-4.7).

FakeRunner keeps the runner's side of the SchedulerOutput contract in plain
Python: per-request state from first sight until finished_req_ids, swap-out
copies, then swap-in copies, then the "forward": write every scheduled token id
into its KV slot, then check that every position a request attends to holds
that request's token. Any block handed to two live requests, any lost swap
copy or wrong prefix hit shows up as a wrong slot.
"""

from __future__ import annotations

import pytest

from edgellm.config import CacheConfig, SchedulerConfig
from edgellm.engine.request import FinishReason, Request, RequestStatus
from edgellm.engine.sampling_params import SamplingParams
from edgellm.engine.sched_output import RunnerOutput, SchedulerOutput, TokenLogprobs
from edgellm.engine.scheduler import Scheduler

BS = 16


def next_token(tokens: list[int]) -> int:
    """A deterministic "model": the next token depends on the whole history only."""
    return (31 * tokens[-1] + 7 * len(tokens)) % 997 + 3000


class FakeRunner:
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, script: dict[str, list[int]] | None = None) -> None:
        self.gpu = [[None] * BS for _ in range(num_gpu_blocks)]
        self.cpu = [[None] * BS for _ in range(max(num_cpu_blocks, 1))]
        self.reqs: dict[str, dict] = {}  # req_id -> {"tokens": [...], "blocks": [...]}
        self.script = script or {}  # req_id -> tokens to sample in order (else next_token)
        self.streamed: dict[str, list[int]] = {}  # req_id -> every accepted token, filled by step()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        for req_id in out.finished_req_ids:
            self.reqs.pop(req_id, None)
        for g, c in out.blocks_to_swap_out:
            self.cpu[c] = list(self.gpu[g])
        for c, g in out.blocks_to_swap_in:
            self.gpu[g] = list(self.cpu[c])
        start = {}
        for new in out.new_reqs:
            self.reqs[new.req_id] = {"tokens": list(new.prompt_token_ids), "blocks": list(new.block_ids)}
            start[new.req_id] = new.num_computed_tokens
        cached = out.cached_reqs
        for req_id, block_ids, computed, resumed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, cached.resumed
        ):
            state = self.reqs[req_id]
            state["blocks"] = list(block_ids) if resumed else state["blocks"] + block_ids
            start[req_id] = computed
        assert set(start) == set(out.num_scheduled_tokens)
        for req_id, n in out.num_scheduled_tokens.items():  # write K/V of the whole step first
            state, c = self.reqs[req_id], start[req_id]
            for pos in range(c, c + n):
                self.gpu[state["blocks"][pos // BS]][pos % BS] = state["tokens"][pos]
        req_ids, sampled = [], []
        for req_id, n in out.num_scheduled_tokens.items():  # then attend
            state, c = self.reqs[req_id], start[req_id]
            assert 0 not in state["blocks"]
            seen = [self.gpu[state["blocks"][pos // BS]][pos % BS] for pos in range(c + n)]
            assert seen == state["tokens"][: c + n], f"{req_id}: KV content differs"
            if c + n == len(state["tokens"]):
                script = self.script.get(req_id)
                token = script.pop(0) if script else next_token(state["tokens"])
                state["tokens"].append(token)
            else:
                token = -1  # a partial prefill's sample: the scheduler must drop it
            req_ids.append(req_id)
            sampled.append([token])
        return RunnerOutput(req_ids, sampled)


def make_scheduler(
    num_gpu_blocks: int = 64,
    num_cpu_blocks: int = 0,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 256,
    enable_prefix_caching: bool = True,
    swap_min_tokens: int = 0,
) -> Scheduler:
    sched_config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, swap_min_tokens)
    cache_config = CacheConfig(block_size=BS, enable_prefix_caching=enable_prefix_caching)
    return Scheduler(sched_config, cache_config, num_gpu_blocks, num_cpu_blocks)


def make_request(req_id: str, prompt, eos: int | None = None, **params) -> Request:
    return Request(req_id, list(prompt), SamplingParams(**params), eos_token_id=eos, block_size=BS)


def step(sched: Scheduler, runner: FakeRunner):
    out = sched.schedule()
    outputs = sched.update_from_output(out, runner.execute(out))
    for o in outputs:
        runner.streamed.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out, outputs


def run_all(sched: Scheduler, runner: FakeRunner, max_steps: int = 1000) -> dict[str, list[int]]:
    """Step until done; returns every request's accepted tokens, this run and before."""
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            break
        step(sched, runner)
    assert not sched.has_unfinished_requests()
    return runner.streamed


def assert_all_free(sched: Scheduler) -> None:
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.gpu_pool.num_blocks - 1
    assert kv.cpu_pool.num_free_blocks == kv.cpu_pool.num_blocks - 1
    assert kv.req_to_blocks == {} and kv.req_to_cpu_blocks == {}
    assert not sched.waiting and not sched.running and not sched.swapped


def expected_outputs(prompt: list[int], num: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(num):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


# ---- budget, chunked prefill, seats ------------------------------------------------------------


def test_token_budget_and_chunked_prefill_counts():
    sched = make_scheduler(max_num_batched_tokens=32)
    runner = FakeRunner(64, 0)
    sched.add_request(make_request("a", range(50), max_tokens=4))
    sched.add_request(make_request("b", range(100, 110), max_tokens=4))
    out, outputs = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 32} and out.total_num_scheduled_tokens == 32
    assert [r.req_id for r in out.new_reqs] == ["a"] and out.new_reqs[0].block_ids == [1, 2]
    assert outputs == []  # partial prefill: the sample is dropped
    out, outputs = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 18, "b": 10}
    assert out.cached_reqs.req_ids == ["a"] and out.cached_reqs.new_block_ids == [[3, 4]]
    assert out.cached_reqs.num_computed_tokens == [32] and out.cached_reqs.resumed == [False]
    assert out.new_reqs[0].block_ids == [5] and out.new_reqs[0].num_computed_tokens == 0
    assert [(o.request_id, o.new_token_ids) for o in outputs] == [
        ("a", expected_outputs(list(range(50)), 1)),
        ("b", expected_outputs(list(range(100, 110)), 1)),
    ]
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1} and out.new_reqs == []
    assert out.cached_reqs.new_block_ids == [[], []]


def test_max_num_seqs_holds_back_admission():
    sched = make_scheduler(max_num_seqs=2)
    runner = FakeRunner(64, 0)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", range(i * 100, i * 100 + 8), max_tokens=2))
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"r0": 8, "r1": 8} and len(sched.waiting) == 1
    out, outputs = step(sched, runner)
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert [o.finish_reason for o in outputs] == [FinishReason.LENGTH, FinishReason.LENGTH]
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"r2": 8} and out.finished_req_ids == {"r0", "r1"}


# ---- prefix cache -------------------------------------------------------------------------------


def test_prefix_hit_schedules_only_uncached_tokens():
    sched = make_scheduler()
    runner = FakeRunner(64, 0)
    prefix = list(range(48))
    sched.add_request(make_request("a", prefix + [500, 501], max_tokens=3))
    run_all(sched, runner)
    sched.add_request(make_request("b", prefix + [600, 601, 602, 603, 604], max_tokens=3))
    out, outputs = step(sched, runner)
    assert out.num_scheduled_tokens == {"b": 5}
    assert out.new_reqs[0].num_computed_tokens == 48 and out.new_reqs[0].block_ids[:3] == [1, 2, 3]
    assert outputs[0].num_cached_tokens == 48 and sched.num_prefix_cached_tokens == 48
    run_all(sched, runner)
    assert_all_free(sched)


def test_prefix_shared_by_concurrent_requests():
    sched = make_scheduler()
    runner = FakeRunner(64, 0)
    prefix = list(range(32))
    sched.add_request(make_request("a", prefix + [1], max_tokens=5))
    step(sched, runner)  # a's two prefix blocks are cached now
    sched.add_request(make_request("b", prefix + [2], max_tokens=2))
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert out.new_reqs[0].block_ids == [1, 2, 4]
    assert [b.ref_cnt for b in sched.kv_cache_manager.gpu_pool.blocks[1:5]] == [2, 2, 1, 1]


# ---- preemption --------------------------------------------------------------------------------


def test_swap_preemption_exact_blocks_and_resume():
    # 7 usable blocks: two 48-token prompts take 6; the first decode of each needs a 4th block.
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=8, max_model_len=100)
    runner = FakeRunner(8, 8)
    pa, pb = list(range(48)), list(range(100, 148))
    sched.add_request(make_request("a", pa, max_tokens=10))
    sched.add_request(make_request("b", pb, max_tokens=10))
    out, _ = step(sched, runner)
    assert out.num_scheduled_tokens == {"a": 48, "b": 48}
    assert [r.block_ids for r in out.new_reqs] == [[1, 2, 3], [4, 5, 6]]

    out, _ = step(sched, runner)  # a takes block 7; b (newest) is swapped out
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.preempted_req_ids == {"b"}
    assert out.blocks_to_swap_out == [(4, 1), (5, 2), (6, 3)]
    assert out.cached_reqs.new_block_ids == [[7]]
    b = sched.requests["b"]
    assert b.status == RequestStatus.SWAPPED and b.num_computed_tokens == 48 and b.num_preemptions == 1
    assert sched.kv_cache_manager.get_block_ids(b) == [] and list(sched.swapped) == [b]

    for _ in range(8):  # b needs 4 blocks, only 3 free: it waits while a finishes
        out, outputs = step(sched, runner)
        assert out.num_scheduled_tokens == {"a": 1} and out.blocks_to_swap_in == []
    assert outputs[0].finish_reason == FinishReason.LENGTH

    out, _ = step(sched, runner)  # a freed [7 | 3 2 1] behind b's old blocks [6 5 4]
    assert out.finished_req_ids == {"a"}
    assert out.blocks_to_swap_in == [(1, 7), (2, 6), (3, 5)]
    assert out.num_scheduled_tokens == {"b": 1}
    assert out.cached_reqs.req_ids == ["b"] and out.cached_reqs.resumed == [True]
    assert out.cached_reqs.new_block_ids == [[7, 6, 5, 4]] and out.cached_reqs.num_computed_tokens == [48]
    streamed = run_all(sched, runner)
    assert streamed["b"] == expected_outputs(pb, 10)
    assert (sched.num_swap_outs, sched.num_swap_ins, sched.num_recompute_preemptions) == (1, 1, 0)
    assert_all_free(sched)


def test_recompute_preemption_when_swap_pool_is_full():
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=3, max_model_len=100)  # 2 CPU blocks < 3 needed
    runner = FakeRunner(8, 3)
    pa, pb = list(range(48)), list(range(100, 148))
    sched.add_request(make_request("a", pa, max_tokens=10))
    sched.add_request(make_request("b", pb, max_tokens=10))
    step(sched, runner)
    out, _ = step(sched, runner)
    b = sched.requests["b"]
    assert out.preempted_req_ids == {"b"} and out.blocks_to_swap_out == []
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and list(sched.waiting) == [b]
    assert sched.num_recompute_preemptions == 1
    streamed = run_all(sched, runner)
    assert streamed["a"] == expected_outputs(pa, 10)
    assert streamed["b"] == expected_outputs(pb, 10)
    assert sched.num_swap_outs == 0
    assert_all_free(sched)


def test_recompute_resume_hits_its_own_prefix():
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=0, max_model_len=100)
    runner = FakeRunner(8, 0)
    sched.add_request(make_request("a", range(48), max_tokens=3))
    sched.add_request(make_request("b", range(100, 148), max_tokens=3))
    step(sched, runner)
    step(sched, runner)  # b dropped its 3 full, hashed blocks; they stay cached
    step(sched, runner)  # a finishes
    out, _ = step(sched, runner)
    assert out.cached_reqs.req_ids == ["b"] and out.cached_reqs.resumed == [True]
    assert out.cached_reqs.num_computed_tokens == [48]  # the whole prompt came back from the cache
    assert out.num_scheduled_tokens == {"b": 1}


@pytest.mark.parametrize("num_cpu_blocks", [0, 4, 40])
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_heavy_preemption_keeps_outputs_and_frees_everything(num_cpu_blocks, enable_prefix_caching):
    prompts = {f"r{i}": [i % 3] * 16 + list(range(i * 50, i * 50 + 5 + 7 * i)) for i in range(8)}
    sched = make_scheduler(
        num_gpu_blocks=8, num_cpu_blocks=num_cpu_blocks, max_num_batched_tokens=40, max_model_len=100,
        enable_prefix_caching=enable_prefix_caching,
    )
    runner = FakeRunner(8, num_cpu_blocks)
    for req_id, prompt in prompts.items():
        sched.add_request(make_request(req_id, prompt, max_tokens=20))
    streamed = run_all(sched, runner)
    for req_id, prompt in prompts.items():
        assert streamed[req_id] == expected_outputs(prompt, 20), req_id
    assert sched.num_swap_outs + sched.num_recompute_preemptions > 0
    assert sched.num_swap_ins == sched.num_swap_outs
    if num_cpu_blocks == 0:
        assert sched.num_swap_outs == 0
    if num_cpu_blocks == 4:  # room for some victims only: both paths run
        assert sched.num_swap_outs > 0 and sched.num_recompute_preemptions > 0
    if num_cpu_blocks == 40:
        assert sched.num_recompute_preemptions == 0
    assert_all_free(sched)


def test_swap_min_tokens_forces_recompute_for_short_contexts():
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=8, max_model_len=100, swap_min_tokens=64)
    runner = FakeRunner(8, 8)
    sched.add_request(make_request("a", range(48), max_tokens=3))
    sched.add_request(make_request("b", range(100, 148), max_tokens=3))
    step(sched, runner)
    out, _ = step(sched, runner)
    assert out.preempted_req_ids == {"b"} and out.blocks_to_swap_out == []
    assert sched.num_recompute_preemptions == 1


# ---- abort -------------------------------------------------------------------------------------


def test_abort_frees_blocks_at_once():
    sched = make_scheduler(num_gpu_blocks=8, num_cpu_blocks=8, max_model_len=100)
    runner = FakeRunner(8, 8)
    sched.add_request(make_request("a", range(48), max_tokens=10))
    sched.add_request(make_request("b", range(100, 148), max_tokens=10))
    sched.add_request(make_request("c", range(200, 210), max_tokens=10))
    step(sched, runner)  # all three fit: 3 + 3 + 1 blocks
    out, _ = step(sched, runner)  # a's next block: c, then b swapped out, newest first
    assert out.num_scheduled_tokens == {"a": 1} and [r.request_id for r in sched.swapped] == ["b", "c"]
    kv = sched.kv_cache_manager
    assert kv.cpu_pool.num_free_blocks == 3 and kv.num_free_blocks == 3
    sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert kv.cpu_pool.num_free_blocks == 6 and [r.request_id for r in sched.swapped] == ["c"]
    sched.finish_requests(["a", "c", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == 7 and not sched.has_unfinished_requests()
    out = sched.schedule()
    assert out.finished_req_ids == {"a", "b", "c"} and out.total_num_scheduled_tokens == 0
    assert_all_free(sched)


def test_abort_between_schedule_and_update_drops_the_sample():
    sched = make_scheduler()
    runner = FakeRunner(64, 0)
    sched.add_request(make_request("a", range(10), max_tokens=5))
    out = sched.schedule()
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(out, runner.execute(out)) == []
    assert_all_free(sched)


# ---- stop conditions ---------------------------------------------------------------------------

EOS = 2


@pytest.mark.parametrize(
    "script, params, expected, reason, stop_reason",
    [
        ([5, 6, EOS, 7], {}, [5, 6, EOS], FinishReason.STOP, None),
        ([EOS, 6, EOS, 7], {"min_tokens": 2}, [EOS, 6, EOS], FinishReason.STOP, None),
        ([5, EOS, 7], {"min_tokens": 2}, [5, EOS], FinishReason.STOP, None),
        ([5, EOS, 7, 8], {"ignore_eos": True, "max_tokens": 4}, [5, EOS, 7, 8], FinishReason.LENGTH, None),
        ([5, 9, 7], {"stop_token_ids": [9]}, [5, 9], FinishReason.STOP, 9),
        ([9, 9, 7], {"stop_token_ids": [9], "min_tokens": 2}, [9, 9], FinishReason.STOP, 9),
        ([5, 6, 7, 8], {"max_tokens": 3}, [5, 6, 7], FinishReason.LENGTH, None),
        ([5, 6, EOS], {"max_tokens": 3}, [5, 6, EOS], FinishReason.STOP, None),
        ([5] * 20, {"max_tokens": None}, [5] * 6, FinishReason.LENGTH, None),  # 10 + 6 = max_model_len 16
    ],
)
def test_stop_conditions(script, params, expected, reason, stop_reason):
    sched = make_scheduler(max_model_len=16)
    runner = FakeRunner(64, 0, script={"r": list(script)})
    sched.add_request(make_request("r", range(10), eos=EOS, **params))
    outputs = []
    while sched.has_unfinished_requests():
        outputs += step(sched, runner)[1]
    assert [t for o in outputs for t in o.new_token_ids] == expected
    assert [o.finish_reason for o in outputs] == [None] * (len(expected) - 1) + [reason]
    assert outputs[-1].stop_reason == stop_reason
    assert_all_free(sched)


def test_prompt_equal_to_max_model_len_gets_one_token():
    sched = make_scheduler(max_model_len=16)
    sched.add_request(make_request("r", range(16), max_tokens=5))
    outputs = run_all(sched, FakeRunner(64, 0))
    assert len(outputs["r"]) == 1


def test_prompt_too_long():
    sched = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match=r"^request r: prompt has 17 tokens > max_model_len 16$"):
        sched.add_request(make_request("r", range(17)))


def test_pool_too_small_for_max_model_len():
    with pytest.raises(ValueError, match=r"^KV cache: 7 blocks hold 112 tokens < max_model_len 200; "):
        make_scheduler(num_gpu_blocks=8, max_model_len=200)


def test_logprobs_follow_accepted_tokens():
    sched = make_scheduler()
    sched.add_request(make_request("r", range(4), max_tokens=1, logprobs=1))
    out = sched.schedule()
    lp = TokenLogprobs([7, 8], [-0.1, -2.0])
    (o,) = sched.update_from_output(out, RunnerOutput(["r"], [[7]], [[lp]]))
    assert o.new_token_ids == [7] and o.new_logprobs == [lp] and o.finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CacheConfig(block_size=12), "CacheConfig.block_size: expected a power of two in [1, 128], got 12"),
        (
            lambda: CacheConfig(gpu_memory_utilization=1.5),
            "CacheConfig.gpu_memory_utilization: expected in (0, 1], got 1.5",
        ),
        (lambda: SchedulerConfig(max_num_seqs=0), "SchedulerConfig.max_num_seqs: expected an integer >= 1, got 0"),
        (lambda: make_scheduler(max_model_len=None), "SchedulerConfig.max_model_len: expected an integer, got None"),
    ],
)
def test_config_errors_name_field_and_range(build, message):
    with pytest.raises(ValueError) as err:
        build()
    assert str(err.value).startswith(message)
