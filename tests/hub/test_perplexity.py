"""edgellm.perplexity against the Hugging Face guide's recipe, written out here as the oracle.

The toy model's logits depend on every earlier token of the window (a running mean of
embeddings), so a window that got the wrong context or scored the wrong tokens would
change the result.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from edgellm.perplexity import compute_perplexity

VOCAB = 50


class RunningMeanLM:
    """logits[p] = mean(embed[ids[:p + 1]]) @ head: causal, and context-dependent."""

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(VOCAB, 16, generator=gen, dtype=torch.float64)
        self.head = torch.randn(16, VOCAB, generator=gen, dtype=torch.float64)

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed[input_ids]  # [B, T, 16]
        counts = torch.arange(1, input_ids.shape[1] + 1, dtype=torch.float64)[None, :, None]
        return (x.cumsum(dim=1) / counts) @ self.head  # [B, T, V]


def hf_guide_perplexity(model: RunningMeanLM, ids: torch.Tensor, window: int, stride: int) -> tuple[float, int]:
    """The loop of huggingface.co/docs/transformers/perplexity, with the loss computed as
    a transformers causal LM does (labels shifted by one, -100 ignored), summed not averaged."""
    seq_len = ids.numel()
    nll_sum, num_scored, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + window, seq_len)
        trg_len = end_loc - prev_end_loc
        input_ids = ids[begin_loc:end_loc][None]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        logits = model(input_ids)
        shift_logits, shift_labels = logits[0, :-1], target_ids[0, 1:]
        nll_sum += F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum").item()
        num_scored += int((shift_labels != -100).sum())
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return math.exp(nll_sum / num_scored), num_scored


@pytest.mark.parametrize(
    ("num_tokens", "window", "stride"),
    [(100, 32, 16), (100, 32, 32), (100, 32, 1), (101, 32, 7), (100, 200, 50), (33, 32, 16), (2, 8, 4)],
)
def test_matches_hf_guide(num_tokens: int, window: int, stride: int) -> None:
    ids = torch.randint(0, VOCAB, (num_tokens,), generator=torch.Generator().manual_seed(num_tokens))
    model = RunningMeanLM()
    expected_ppl, expected_scored = hf_guide_perplexity(model, ids, window, stride)
    result = compute_perplexity(model, ids.tolist(), window=window, stride=stride)
    assert result.num_scored_tokens == expected_scored
    assert result.perplexity == pytest.approx(expected_ppl, rel=1e-6)  # log-probs in float32 by design
    assert result.num_tokens == num_tokens


def test_every_token_but_the_first_is_scored_when_stride_is_below_window() -> None:
    ids = torch.randint(0, VOCAB, (1000,), generator=torch.Generator().manual_seed(1))
    result = compute_perplexity(RunningMeanLM(), ids, window=128, stride=64)
    assert result.num_scored_tokens == 999
    assert result.num_windows == 15  # starts 0, 64, ..., 896 (896 + 128 >= 1000)


def test_uniform_model_has_perplexity_vocab_size() -> None:
    def uniform(input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, VOCAB, dtype=torch.float16)

    result = compute_perplexity(uniform, list(range(40)), window=16, stride=8)
    assert result.perplexity == pytest.approx(VOCAB, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 1, "stride": 1}, "perplexity window: expected >= 2 tokens, got 1"),
        ({"window": 8, "stride": 9}, r"perplexity stride: expected 1 <= stride <= window \(8\), got 9"),
        ({"window": 8, "stride": 0}, r"perplexity stride: expected 1 <= stride <= window \(8\), got 0"),
    ],
)
def test_bad_windows_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_perplexity(RunningMeanLM(), list(range(10)), **kwargs)


def test_a_single_token_is_refused() -> None:
    with pytest.raises(ValueError, match="perplexity text: expected at least 2 tokens, got 1"):
        compute_perplexity(RunningMeanLM(), [3])
