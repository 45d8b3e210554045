"""LLM: the offline Python API over LLMEngine (vLLM's `LLM` names and behaviour).

    llm = LLM("smollm2-135m-instruct", max_num_seqs=16)
    outs = llm.generate(["Hello", "The capital of France is"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].outputs[0].text

`generate` queues every prompt, steps the engine until all are finished and returns
one RequestOutput per prompt, in input order. n > 1 gives n CompletionOutputs per
prompt (the engine fans them out; they share the prompt's cached blocks).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from edgellm.engine.engine import LLMEngine, engine_config_from_args
from edgellm.engine.sampling_params import SamplingParams
from edgellm.outputs import RequestOutput

Message = dict[str, str]


class LLM:
    def __init__(self, model: str, device: str = "cpu", dtype: str = "auto", **engine_args: Any) -> None:
        """engine_args (vLLM names): block_size, gpu_memory_utilization, swap_space, max_num_seqs,
        max_num_batched_tokens, max_model_len, enable_prefix_caching, num_gpu_blocks_override, seed."""
        self.engine = LLMEngine(engine_config_from_args(model, device, dtype, **engine_args))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Texts or token-id lists -> one finished RequestOutput each, in input order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        return self._run(list(prompts), sampling_params, use_tqdm, add_special_tokens=True)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation or a list of them, rendered with the tokenizer's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.engine.tokenizer
        texts = [
            tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt)
            for conv in conversations
        ]
        # the template already writes BOS and friends: do not add them a second time
        return self._run(texts, sampling_params, use_tqdm, add_special_tokens=False)

    def _run(self, prompts: list, sampling_params, use_tqdm: bool, add_special_tokens: bool) -> list[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params: expected one per prompt ({len(prompts)}), got {len(params)}")
        ids = [str(next(self._ids)) for _ in prompts]
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                self.engine.add_request(rid, prompt, p, add_special_tokens=add_special_tokens)
            finished: dict[str, RequestOutput] = {}
            bar = _progress_bar(len(prompts)) if use_tqdm else None
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    finished[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                bar.close()
        except BaseException:
            self.engine.abort_request(ids)  # leave no half-run request behind (KeyboardInterrupt, bad prompt)
            raise
        return [finished[rid] for rid in ids]


def _progress_bar(total: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req")
