"""Perplexity of a causal LM over a long text, with a sliding window.

The recipe of Hugging Face's "Perplexity of fixed-length models" guide: windows of
`window` tokens start every `stride` tokens; in each window only the tokens not scored
by an earlier window are scored, so every window after the first gives its new tokens
`window - stride` tokens of context:

    tokens     0 ........................................ N
    window 0   [ scored (from token 1) .............. )
    window 1             [ context    | scored ...... )
    window 2                          [ context | scored ...... )
                         <- window - stride ->

A window's first token has nothing to be predicted from and is never scored: a text
of N tokens scores N - 1 tokens when stride < window, and one fewer per extra window
when stride == window (as in the guide). The model is any callable `input_ids [1, T] -> logits [1, T, V]`
(`edgellm.load_model`, a transformers model wrapped in a lambda, a toy model in a test).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    perplexity: float  # exp(nll_sum / num_scored_tokens)
    nll_sum: float  # summed negative log-likelihood, nats, accumulated in float64
    num_scored_tokens: int  # num_tokens - 1 when stride < window
    num_tokens: int  # length of the tokenized text
    num_windows: int


def compute_perplexity(
    model: Callable[[torch.Tensor], torch.Tensor],
    token_ids: Sequence[int] | torch.Tensor,
    window: int = 1024,
    stride: int = 512,
    device: torch.device | str = "cpu",
    show_progress: bool = False,
) -> PerplexityResult:
    """Sliding-window perplexity of `token_ids` under `model` (see the module docstring).

    Log-probabilities are taken in float32 whatever the logits' dtype, and summed in
    float64, so a half-precision model's result differs from fp32 only by its logits.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
    num_tokens = ids.numel()
    if window < 2:
        raise ValueError(f"perplexity window: expected >= 2 tokens, got {window}")
    if not 1 <= stride <= window:
        raise ValueError(f"perplexity stride: expected 1 <= stride <= window ({window}), got {stride}")
    if num_tokens < 2:
        raise ValueError(f"perplexity text: expected at least 2 tokens, got {num_tokens}")

    starts: list[int] = []
    for start in range(0, num_tokens, stride):
        starts.append(start)
        if start + window >= num_tokens:
            break
    nll_sum = 0.0
    num_scored = 0
    scored_until = 0  # first token not scored yet
    with torch.inference_mode():
        for start in tqdm(starts, desc="perplexity", unit="window", disable=not show_progress):
            end = min(start + window, num_tokens)
            input_ids = ids[start:end].unsqueeze(0).to(device)  # [1, T]
            logits = model(input_ids)  # [1, T, V]
            # logits at window position p predict token p + 1, so a window's own first
            # token is never scored; score window positions [first, T)
            first = max(scored_until, start + 1) - start
            log_probs = F.log_softmax(logits[0, first - 1 : -1].float(), dim=-1)  # [n, V]
            targets = input_ids[0, first:]  # [n]
            nll_sum -= log_probs.gather(-1, targets.unsqueeze(-1)).double().sum().item()
            num_scored += targets.numel()
            scored_until = end
    return PerplexityResult(
        perplexity=math.exp(nll_sum / num_scored),
        nll_sum=nll_sum,
        num_scored_tokens=num_scored,
        num_tokens=num_tokens,
        num_windows=len(starts),
    )
