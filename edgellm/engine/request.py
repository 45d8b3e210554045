"""Request: one sequence's token state as the scheduler sees it.

    prompt_token_ids   output_token_ids
    |p p p p p p p p p p|o o o|            all_token_ids (num_tokens = 13)
    |<-- num_computed_tokens -->|          K/V written for these (here 11)
    |  block 0 (16)  ...                   block_hashes: one per *full* block of all_token_ids

Block hashes are chained (design §4.3): hash_i = sha256(hash_{i-1} || int32 tokens
of block i [|| cache_salt for block 0]) truncated to 128 bits, the first parent a
fixed seed. They are computed for the full prompt blocks at creation and extended
whenever appended output tokens fill a block, so `block_hashes` always has exactly
`num_tokens // block_size` entries. Pure Python: no torch.
"""

from __future__ import annotations

import enum
import hashlib
import time
from array import array
from collections.abc import Sequence

from edgellm.engine.sampling_params import SamplingParams

BlockHash = bytes  # 16-byte digest
ROOT_HASH: BlockHash = hashlib.sha256(b"edgellm-block-hash-root").digest()[:16]


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], salt: str | None = None) -> BlockHash:
    """128-bit chained hash of one full block: parent digest, int32 tokens, optional salt."""
    h = hashlib.sha256(parent)
    h.update(array("i", token_ids).tobytes())
    if salt is not None:
        h.update(salt.encode())
    return h.digest()[:16]


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token / stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # client went away or the engine dropped it


class RequestStatus(enum.Enum):
    WAITING = enum.auto()  # in `waiting`, never scheduled
    RUNNING = enum.auto()  # in `running`, owns device blocks
    PREEMPTED = enum.auto()  # dropped its blocks (recompute); back at the front of `waiting`
    SWAPPED = enum.auto()  # its blocks live in the CPU pool; in `swapped`
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


class Request:
    """Token ids, progress and cache identity of one request (one sequence; n > 1 is fanned out above)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        block_size: int = 16,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError(f"request {request_id}: prompt_token_ids is empty")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.block_size = block_size
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.cache_salt = cache_salt

        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose K/V is written (or scheduled to be, this step)
        self.num_cached_tokens = -1  # prefix-cache hit at first scheduling; -1 until then
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None  # the stop token id that finished it, if one did
        self.block_hashes: list[BlockHash] = []
        self._hash_full_blocks()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Append sampled tokens and hash any block they fill."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
        self._hash_full_blocks()

    def _hash_full_blocks(self) -> None:
        bs = self.block_size
        for i in range(len(self.block_hashes), self.num_tokens // bs):
            parent = self.block_hashes[-1] if self.block_hashes else ROOT_HASH
            salt = self.cache_salt if i == 0 else None
            self.block_hashes.append(hash_block_tokens(parent, self.all_token_ids[i * bs : (i + 1) * bs], salt))

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
