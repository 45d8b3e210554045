"""Sampler: greedy, truncation, penalties (hand-computed), seeds independent of the batch, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from edgellm.engine.sampler import Sampler, SamplingMetadata, apply_penalties
from edgellm.engine.sampling_params import SamplingParams


def meta(params: list[SamplingParams], token_ids=None, num_prompt=None) -> SamplingMetadata:
    gens = [None if p.seed is None else torch.Generator().manual_seed(p.seed) for p in params]
    token_ids = token_ids or [[] for _ in params]
    return SamplingMetadata(params, gens, token_ids, num_prompt or [len(t) for t in token_ids])


def sampler(seed: int = 0) -> Sampler:
    return Sampler(torch.Generator().manual_seed(seed))


LOGITS = torch.tensor([[1.0, 3.0, 2.0, -1.0], [0.5, 0.1, 0.2, 4.0]])


def test_greedy_is_argmax():
    out = sampler()(LOGITS, meta([SamplingParams(temperature=0)] * 2))
    assert out.token_ids == [1, 3] and out.logprobs is None


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=5.0, top_k=1),
        SamplingParams(temperature=5.0, top_p=0.01),
        SamplingParams(temperature=5.0, min_p=1.0),
    ],
    ids=["top_k=1", "top_p=0.01", "min_p=1"],
)
def test_truncation_to_one_token_is_greedy(params):
    s = sampler()
    for _ in range(20):
        assert s(LOGITS, meta([params, params])).token_ids == [1, 3]


def test_top_k_and_top_p_keep_only_their_set():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    s = sampler()
    seen_k = {s(logits, meta([SamplingParams(top_k=2)])).token_ids[0] for _ in range(200)}
    assert seen_k == {0, 1}
    # top_p 0.65: 0.4 + 0.3 reaches it, so tokens 0 and 1 only
    seen_p = {s(logits, meta([SamplingParams(top_p=0.65)])).token_ids[0] for _ in range(200)}
    assert seen_p == {0, 1}
    # min_p 0.6: tokens with p >= 0.6 * 0.4 = 0.24: 0 and 1
    seen_m = {s(logits, meta([SamplingParams(min_p=0.6)])).token_ids[0] for _ in range(200)}
    assert seen_m == {0, 1}


def test_exponential_race_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = torch.log(probs).repeat(4000, 1)
    out = sampler(1)(logits, meta([SamplingParams(temperature=1.0)] * 4000)).token_ids
    freq = torch.bincount(torch.tensor(out), minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_penalties_match_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, 3.0]])
    # prompt [0], output [1, 3, 3]
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, meta([params], [[0, 1, 3, 3]], [1]))
    # repetition on seen {0, 1, 3}: positive / 2, negative * 2
    # then output counts {1: 1, 3: 2}: -0.25 * count - 0.5 * present
    expected = torch.tensor([[1.0, -2.0 - 0.25 - 0.5, 0.5, 0.5 - 0.5 - 0.5, 3.0]])
    assert torch.equal(out, expected)


def test_repetition_penalty_changes_greedy_choice():
    logits = torch.tensor([[3.0, 2.0]])
    out = sampler()(logits, meta([SamplingParams(temperature=0, repetition_penalty=2.0)], [[0]], [1]))
    assert out.token_ids == [1]  # 3 / 2 = 1.5 < 2


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = [sampler(7)(logits[2:3], meta([p])).token_ids[0]]
    # the same request (same seed, same logits row) sampled at row 4 of a batch with unseeded neighbours
    mixed_logits = torch.cat([logits[:2], logits[3:5], logits[2:3], logits[5:]])
    params = [SamplingParams(temperature=1.0)] * 4 + [p] + [SamplingParams(temperature=0.7)]
    batch = sampler(99)(mixed_logits, meta(params)).token_ids[4]
    assert alone == [batch]
    # and over several steps with one generator per request
    g_alone, g_batch = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    s1, s2 = sampler(1), sampler(2)
    for _ in range(10):
        a = s1(logits[2:3], SamplingMetadata([p], [g_alone], [[]], [0])).token_ids[0]
        gens = [None] * 4 + [g_batch, None]
        b = s2(mixed_logits, SamplingMetadata(params, gens, [[]] * 6, [0] * 6)).token_ids[4]
        assert a == b


def test_logprobs_chosen_first_then_top_n():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    out = sampler()(logits, meta([SamplingParams(temperature=0, logprobs=2)]))
    ids, lps = out.logprobs[0]
    expected = torch.log_softmax(logits[0], -1)
    assert ids == [1, 1, 2]
    assert lps == pytest.approx([expected[1].item(), expected[1].item(), expected[2].item()], abs=1e-6)
    assert math.isclose(sum(math.exp(x) for x in torch.log_softmax(logits[0], -1).tolist()), 1.0, abs_tol=1e-6)


def test_logprobs_only_for_rows_that_ask():
    out = sampler()(LOGITS, meta([SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=0)]))
    assert out.logprobs[0] is None
    assert out.logprobs[1][0] == [3] and len(out.logprobs[1][1]) == 1


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^SamplingParams\.{field}: expected "):
        SamplingParams(**kwargs)


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.tensor([[5.0, 4.0, 3.0, 1.0]])  # EOS (0) then stop id 1 are the top two
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1])
    s = Sampler(torch.Generator().manual_seed(0), eos_token_id=0)
    assert s(logits, meta([p], [[9, 9]], [2])).token_ids == [2]  # no output yet: both banned
    assert s(logits, meta([p], [[9, 9, 7]], [2])).token_ids == [2]  # one output token: still banned
    assert s(logits, meta([p], [[9, 9, 7, 7]], [2])).token_ids == [0]  # min_tokens reached
    assert logits[0, 0] == 5.0  # the caller's logits are not modified
    ignore = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert s(logits, meta([ignore], [[9]], [1])).token_ids == [0]  # ignore_eos: EOS is an ordinary token
