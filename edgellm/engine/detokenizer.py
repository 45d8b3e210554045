"""IncrementalDetokenizer: output token ids -> new text, one step at a time.

A character may span several tokens (byte-level BPE splits UTF-8, byte-fallback
vocabularies emit <0xE6>...), so text is released only once it decodes without a
trailing U+FFFD. Fast tokenizers use tokenizers' `DecodeStream`, which does exactly
this; any other tokenizer uses vLLM's prefix/read offsets
(`vllm/transformers_utils/detokenizer_utils.py` `detokenize_incrementally`):

    tokens   [.. prompt tail ..|  o  o  o  o  ]
                  ^prefix_offset    ^read_offset
    new text = decode(tokens[prefix:]) minus decode(tokens[prefix:read]), released when
               it grew and does not end in U+FFFD; then prefix = read, read = len(tokens).

Both start primed with the prompt's last tokens so a leading space (SentencePiece's
"▁") decodes as it would inside the full text.
"""

from __future__ import annotations

from typing import Any

PROMPT_CONTEXT_TOKENS = 5  # prompt tokens the decoder sees before the first output token (vLLM uses 5)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 use_decode_stream: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        backend = getattr(tokenizer, "backend_tokenizer", None)
        context = prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]
        self._stream = None
        if use_decode_stream and backend is not None:
            from tokenizers.decoders import DecodeStream

            self._backend = backend
            self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        else:
            self._tokens = list(context)
            self._prefix_offset = 0
            self._read_offset = len(context)

    def add(self, token_ids: list[int]) -> str:
        """Feed new output tokens; return the text they complete (possibly "")."""
        pieces = [self._step(t) for t in token_ids]
        return "".join(p for p in pieces if p)

    def _step(self, token_id: int) -> str | None:
        if self._stream is not None:
            return self._stream.step(self._backend, token_id)
        self._tokens.append(token_id)
        decode = self.tokenizer.decode
        prefix_text = decode(self._tokens[self._prefix_offset : self._read_offset], skip_special_tokens=self.skip_special_tokens)
        new_text = decode(self._tokens[self._prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None  # an incomplete character: wait for the tokens that finish it
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        return new_text[len(prefix_text) :]
