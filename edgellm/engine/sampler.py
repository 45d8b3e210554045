"""Sampler: logits [R, V] of one step -> one token per row (design §5.2).

Order, as vLLM V1 `v1/sample/sampler.py`:

    logits (fp32) -> min_tokens ban -> penalties -+-> greedy rows: argmax
                                                  +-> temperature -> min_p -> top_k -> top_p -> argmax(p / Exp(1))

The exponential race picks token t with probability p_t and needs no host sync
(gpt-fast `multinomial_sample_one_no_sync`). Each seeded request draws its Exp(1)
noise from its own `torch.Generator`, one [V] draw per sampled token, so its tokens
do not depend on which other requests share the batch; unseeded rows share the
engine's generator. Logprobs are taken from the distribution after penalties and
temperature (temperature 0 counts as 1), before top-k / top-p / min-p truncation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from edgellm.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingMetadata:
    """Per-row sampling inputs of one step, parallel to the logits rows."""

    params: list[SamplingParams]
    generators: list[torch.Generator | None]  # the request's own generator when it has a seed
    # prompt + output so far, per row: the repetition penalty sees all of it, presence / frequency
    # only the output (vLLM); read only when a row asks for a penalty
    token_ids: list[list[int]]
    num_prompt_tokens: list[int]


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]  # [R]
    # Per row: (token ids, logprobs) with the chosen token first, then the top-N; None when not asked.
    logprobs: list[tuple[list[int], list[float]] | None] | None


class Sampler:
    def __init__(self, generator: torch.Generator, eos_token_id: int | None = None) -> None:
        self.generator = generator  # shared by rows without a seed
        self.eos_token_id = eos_token_id

    def __call__(self, logits: Tensor, meta: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()  # [R, V]
        params = meta.params
        logits = self._ban_stop_tokens(logits, meta)
        if any(_has_penalty(p) for p in params):
            logits = apply_penalties(logits, meta)
        greedy = [p.temperature == 0.0 for p in params]
        if all(greedy) and all(p.logprobs is None for p in params):
            return SamplerOutput(logits.argmax(dim=-1).tolist(), None)

        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
        logits = logits / temps.unsqueeze(1)
        logprobs = _gather_logprobs(logits, params)
        token_ids = logits.argmax(dim=-1)
        if not all(greedy):
            sampled = self._sample(_truncate(logits, params), meta.generators)
            token_ids = torch.where(torch.tensor(greedy, device=logits.device), token_ids, sampled)
        chosen = token_ids.tolist()
        if logprobs is not None:
            lp = torch.log_softmax(logits, dim=-1)
            for i, row in enumerate(logprobs):
                if row is not None:
                    row[0].insert(0, chosen[i])
                    row[1].insert(0, lp[i, chosen[i]].item())
        return SamplerOutput(chosen, logprobs)

    def _ban_stop_tokens(self, logits: Tensor, meta: SamplingMetadata) -> Tensor:
        """Rows short of min_tokens cannot pick EOS or a stop token id (vLLM's MinTokensLogitsProcessor)."""
        banned_rows = []
        for i, p in enumerate(meta.params):
            if p.min_tokens and len(meta.token_ids[i]) - meta.num_prompt_tokens[i] < p.min_tokens:
                banned = list(p.stop_token_ids)
                if self.eos_token_id is not None and not p.ignore_eos:
                    banned.append(self.eos_token_id)
                banned_rows += [(i, t) for t in banned]
        if not banned_rows:
            return logits
        logits = logits.clone()
        rows, cols = zip(*banned_rows)
        logits[list(rows), list(cols)] = float("-inf")
        return logits

    def _sample(self, logits: Tensor, generators: list[torch.Generator | None]) -> Tensor:
        probs = torch.softmax(logits, dim=-1)  # [R, V]
        noise = torch.empty_like(probs)
        for i, g in enumerate(generators):
            noise[i].exponential_(generator=self.generator if g is None else g)
        return (probs / noise).argmax(dim=-1)


def _has_penalty(p: SamplingParams) -> bool:
    return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0


def apply_penalties(logits: Tensor, meta: SamplingMetadata) -> Tensor:
    """vLLM's penalties: repetition over prompt + output tokens, presence / frequency over output tokens."""
    logits = logits.clone()
    V = logits.shape[1]
    for i, p in enumerate(meta.params):
        if not _has_penalty(p):
            continue
        tokens = torch.tensor(meta.token_ids[i], dtype=torch.long, device=logits.device)
        out = tokens[meta.num_prompt_tokens[i] :]
        if p.repetition_penalty != 1.0:
            seen = torch.zeros(V, dtype=torch.bool, device=logits.device)
            seen[tokens] = True
            row = logits[i]
            penalised = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
            logits[i] = torch.where(seen, penalised, row)
        if out.numel():
            counts = torch.bincount(out, minlength=V).to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _truncate(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Mask to −inf what min_p, top_k and top_p exclude; at least the most likely token survives."""
    V = logits.shape[1]
    dev = logits.device
    if any(p.min_p > 0.0 for p in params):
        probs = torch.softmax(logits, dim=-1)
        min_p = torch.tensor([p.min_p for p in params], device=dev).unsqueeze(1)
        logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    top_k = [p.top_k if 0 < p.top_k < V else V for p in params]
    top_p = [p.top_p for p in params]
    if all(k == V for k in top_k) and all(tp == 1.0 for tp in top_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [R, V]
    rank = torch.arange(V, device=dev).unsqueeze(0)
    drop = rank >= torch.tensor(top_k, device=dev).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # drop a token when the mass strictly before it already reaches top_p (keeps rank 0 always)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= torch.tensor(top_p, device=dev).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _gather_logprobs(logits: Tensor, params: list[SamplingParams]) -> list[tuple[list[int], list[float]] | None] | None:
    """Top-N (token ids, logprobs) per row that asked; the chosen token is prepended by the caller."""
    wanted = [p.logprobs for p in params]
    if all(n is None for n in wanted):
        return None
    lp = torch.log_softmax(logits, dim=-1)
    top_n = max(n for n in wanted if n is not None)
    values, ids = lp.topk(top_n, dim=-1) if top_n else (lp[:, :0], lp[:, :0].long())
    out: list[tuple[list[int], list[float]] | None] = []
    for i, n in enumerate(wanted):
        out.append(None if n is None else (ids[i, :n].tolist(), values[i, :n].tolist()))
    return out
