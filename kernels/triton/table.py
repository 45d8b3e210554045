"""The dispatch table: which kernel and block sizes run a (bits, group, N, K, M-bucket).

    kernels/configs/<GPU_NAME>.json     shipped, measured winners (e.g. NVIDIA_H200.json)
    $EDGELLM_HOME/kernels/<GPU_NAME>.json   the user's warm-up results for other cards/shapes

    {"gpu": "NVIDIA H200", "torch": "...", "triton": "...", "created": "...",
     "entries": {"b4_g128_n4096_k4096": {"1": {"kernel": "gemv", "block_m": 1, ...}, "2": ...}}}

Lookup: M rounds up to a bucket (M_BUCKETS; above the last, the last); the exact key wins,
else the same (bits, group, bucket) at the nearest N*K, else the same (bits, N, K, bucket) at
another group size, else `default_choice` (a heuristic, never a timing run: no autotuning on
the request path; `tune.warmup` fills the table). The dispatcher re-checks that a borrowed
choice can tile the weight and uses `default_choice` when it cannot.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
KERNELS = ("gemv", "gemv_h2", "gemm", "dequant_mm")
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True, slots=True)
class KernelChoice:
    kernel: str  # one of KERNELS (gemv_h2: fp16 x at M = 1 only; block_n 128 or 256)
    block_m: int = 16
    block_n: int = 64
    block_k: int = 64  # codes (not words) per K step
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@dataclass(slots=True)
class DispatchTable:
    gpu: str
    entries: dict[str, dict[int, KernelChoice]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def lookup(self, bits: int, group: int, N: int, K: int, M: int, num_sms: int) -> KernelChoice:
        bucket = m_bucket(M)
        row = self.entries.get(shape_key(bits, group, N, K))
        if row is not None and bucket in row:
            return row[bucket]
        prefix = f"b{bits}_g{group}_"
        near = [
            (abs(_nk(key) - N * K), key) for key, r in self.entries.items()
            if key.startswith(prefix) and bucket in r
        ]
        if near:
            return self.entries[min(near)[1]][bucket]
        for key, r in self.entries.items():  # same bits and shape, other group size: block sizes carry over
            if key.startswith(f"b{bits}_") and key.endswith(f"_n{N}_k{K}") and bucket in r:
                return r[bucket]
        return default_choice(bits, group, N, K, M, num_sms)

    def to_json(self) -> dict:
        return {
            "gpu": self.gpu, **self.meta,
            "entries": {
                key: {str(b): asdict(c) for b, c in sorted(row.items())} for key, row in sorted(self.entries.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict, where: str) -> DispatchTable:
        if not isinstance(data.get("entries"), dict) or "gpu" not in data:
            raise ValueError(f"{where}: expected a dispatch table with 'gpu' and 'entries', got keys {sorted(data)}")
        entries = {}
        for key, row in data["entries"].items():
            entries[key] = {}
            for b, c in row.items():
                choice = KernelChoice(**c)
                if choice.kernel not in KERNELS:
                    raise ValueError(f"{where}: entries.{key}.{b}.kernel: expected one of {KERNELS}, got {choice.kernel!r}")
                entries[key][int(b)] = choice
        meta = {k: str(v) for k, v in data.items() if k not in ("gpu", "entries")}
        return cls(gpu=data["gpu"], entries=entries, meta=meta)

    def merged(self, other: DispatchTable) -> DispatchTable:
        """self's entries overlaid with other's (other wins)."""
        entries = {k: dict(v) for k, v in self.entries.items()}
        for key, row in other.entries.items():
            entries.setdefault(key, {}).update(row)
        return DispatchTable(gpu=self.gpu, entries=entries, meta={**self.meta, **other.meta})


def _nk(key: str) -> int:
    parts = dict((p[0], p[1:]) for p in key.split("_"))
    return int(parts["n"]) * int(parts["k"])


def m_bucket(M: int) -> int:
    for b in M_BUCKETS:
        if M <= b:
            return b
    return M_BUCKETS[-1]


def table_group(group_size: int, K: int) -> int:
    """-1 for one group over K (per-channel), else the group size."""
    return -1 if group_size >= K else group_size


def shape_key(bits: int, group: int, N: int, K: int) -> str:
    return f"b{bits}_g{group}_n{N}_k{K}"


def gpu_file_name(device: torch.device) -> str:
    """'NVIDIA H200' -> 'NVIDIA_H200'."""
    name = torch.cuda.get_device_name(device)
    return "".join(c if c.isalnum() else "_" for c in name)


def user_dir() -> Path:
    return Path(os.environ.get("EDGELLM_HOME", Path.home() / ".cache" / "edgellm")) / "kernels"


def read_table(path: Path) -> DispatchTable:
    with open(path) as f:
        return DispatchTable.from_json(json.load(f), str(path))


def write_table(table: DispatchTable, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(table.to_json(), f, indent=1)
        f.write("\n")
    tmp.replace(path)


def load_table(device: torch.device) -> DispatchTable:
    """Shipped table for this GPU, overlaid with the user's warm-up cache; empty if neither exists."""
    name = gpu_file_name(device)
    table = DispatchTable(gpu=torch.cuda.get_device_name(device))
    for path in (SHIPPED_DIR / f"{name}.json", user_dir() / f"{name}.json"):
        if path.is_file():
            table = table.merged(read_table(path))
    logger.info("kernel dispatch table for %s: %d shapes", table.gpu, len(table.entries))
    return table


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def default_choice(bits: int, group: int, N: int, K: int, M: int, num_sms: int) -> KernelChoice:
    """A reasonable untuned choice (no timing): GEMV for M <= 4, split-K GEMM up to 64, GEMM above."""
    pf = 32 // bits
    if group != -1 and group % pf != 0:
        return KernelChoice("dequant_mm")
    if M <= 4:
        block_k = 16 * pf if bits != 2 else 8 * pf  # 128 codes at 4-bit
        if group != -1 and group % block_k != 0:
            block_k = max(pf, min(block_k, group & -group))
        block_n = 128
        split = _split_for(N, K, block_n, block_k, num_sms, tiles_m=1)
        return KernelChoice("gemv", block_m=_pow2_at_least(M), block_n=block_n, block_k=block_k,
                            split_k=split, num_warps=4, num_stages=3)
    block_m = min(128, max(16, _pow2_at_least(M)))
    block_n = 64 if M <= 64 else 128
    block_k = 128 if bits == 4 else 64 if bits == 8 else 256
    if group != -1 and group % block_k != 0 and group >= max(16, pf):
        block_k = max(16, pf, min(block_k, group & -group))
    tiles_m = -(-M // block_m)
    split = _split_for(N, K, block_n, block_k, num_sms, tiles_m) if M <= 64 else 1
    warps = 4 if block_m * block_n <= 64 * 64 else 8
    return KernelChoice("gemm", block_m=block_m, block_n=block_n, block_k=block_k, split_k=split,
                        num_warps=warps, num_stages=3)


def _split_for(N: int, K: int, block_n: int, block_k: int, num_sms: int, tiles_m: int) -> int:
    tiles = tiles_m * -(-N // block_n)
    split = 1
    while tiles * split * 2 <= 2 * num_sms and K // (split * 2) >= 4 * block_k and split < 16:
        split *= 2
    return split
