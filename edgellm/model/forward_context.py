"""ForwardContext: the attention metadata of one flat-batch step (design §5.1).

The runner builds it once per step and passes it as an argument down
`CausalLM.forward_flat` to every Attention layer (no module-global state, unlike
nano-vllm's `utils/context.py`). Request i owns flat rows
query_start_loc[i] : query_start_loc[i + 1]; see `reference.PagedAttentionPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from edgellm.kernels.reference import PagedAttentionPlan


@dataclass(slots=True)
class ForwardContext:
    slot_mapping: Tensor  # int64 [T]: cache slot of each token's K/V (block_id * block_size + offset), −1 = skip
    block_tables: Tensor  # int64 [R, max_blocks]: block ids per request, padded with the null block 0
    seq_lens: Tensor  # int64 [R]: keys per request after this step (computed + scheduled)
    query_start_loc: Tensor  # int64 [R + 1]: cumulative query lengths (cu_seqlens_q)
    kv_caches: list[Tensor]  # per layer [2, num_blocks, block_size, Hkv, D]: K at [0], V at [1]
    # the index work every layer's attention shares (groups, masks, gather ids), built once per step
    plan: PagedAttentionPlan = field(init=False)

    def __post_init__(self) -> None:
        block_size = self.kv_caches[0].shape[2]
        self.plan = PagedAttentionPlan.build(
            self.slot_mapping, self.block_tables, self.seq_lens, self.query_start_loc, block_size
        )
