"""Quantization detection: a model directory's config files -> `QuantSpec`, or None for a float checkpoint.

Sources, in the order transformers and vLLM read them (formats.md §0.1):
`config.json["quantization_config"]`, then `quantize_config.json`, then `quant_config.json`.
Every source present is parsed; two that disagree are refused (T17), since AutoGPTQ and
GPTQModel prefer `quantize_config.json` while transformers prefers `config.json`.

Keys are lower-cased and aliases resolved (formats.md §1.7, §2.4, §3.5):

    bits        <- bits, w_bit, wbits                (compressed-tensors: weights.num_bits)
    group_size  <- group_size, q_group_size          (-1: one group over K)
    format      <- format, checkpoint_format; AWQ also version (compressed-tensors `version`
                   is the library version, never a format)
    method      <- quant_method, method
    sym         <- sym, not zero_point

Anything that changes tensor sets or layouts and is not implemented is refused with one
line naming the file and field; nothing is ignored silently (T18).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from edgellm.quant.spec import QuantMethod, QuantSpec

logger = logging.getLogger(__name__)

GPTQ_BITS = (2, 3, 4, 8)
AWQ_BITS = (4,)
CT_BITS = (3, 4, 8)
GPTQ_FORMATS = ("gptq", "gptq_v2")
AWQ_FORMATS = ("gemm", "gemv")
CT_FORMAT = "pack-quantized"
# -1 (one group over K) or a power of two the kernels tile evenly.
GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)
SIDE_FILES = ("quantize_config.json", "quant_config.json")
AWQ_ONLY_KEYS = ("w_bit", "q_group_size", "version", "zero_point")


def detect_quant_spec(model_dir: str | Path) -> QuantSpec | None:
    """The checkpoint's QuantSpec, or None when no config file carries a quantization config."""
    model_dir = Path(model_dir)
    found: list[tuple[str, QuantSpec]] = []
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no such file (a model directory needs config.json)")
    qcfg = _read_json(config_path).get("quantization_config")
    if qcfg is not None:
        found.append(("config.json quantization_config", parse_quant_config(qcfg, "config.json quantization_config.")))
    for name in SIDE_FILES:
        path = model_dir / name
        if path.is_file():
            found.append((name, parse_quant_config(_read_json(path), f"{name} ")))
    if not found:
        return None
    (first_name, first), rest = found[0], found[1:]
    for name, spec in rest:
        if spec != first:
            field = next(f.name for f in dataclasses.fields(QuantSpec) if getattr(spec, f.name) != getattr(first, f.name))
            raise ValueError(
                f"{first_name} and {name} disagree on {field}: {getattr(first, field)!r} vs {getattr(spec, field)!r}"
            )
    return first


def parse_quant_config(raw: Any, where: str) -> QuantSpec:
    """One quantization config dict -> QuantSpec. `where` prefixes field names in errors."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where.rstrip('. ')}: expected an object, got {raw!r}")
    d = {str(k).lower(): v for k, v in raw.items()}
    method = _alias(d, where, "quant_method", ("quant_method", "method"))
    if method is None:
        # Old uploads omit the method: AWQ-only keys mean AWQ, a bare `bits` means GPTQ (formats.md §0.2).
        method = "awq" if any(k in d for k in AWQ_ONLY_KEYS) else "gptq" if "bits" in d else None
    method = str(method).lower() if method is not None else None
    if method == QuantMethod.GPTQ.value:
        return _parse_gptq(d, where)
    if method == QuantMethod.AWQ.value:
        return _parse_awq(d, where)
    if method == QuantMethod.COMPRESSED_TENSORS.value:
        return _parse_compressed_tensors(d, where)
    methods = ", ".join(m.value for m in QuantMethod)
    raise ValueError(f"{where}quant_method: expected one of {methods}, got {method!r}")


def _parse_gptq(d: dict[str, Any], where: str) -> QuantSpec:
    _refuse_gptqmodel_extras(d, where)
    if d.get("is_marlin_format"):
        raise ValueError(f"{where}is_marlin_format: Marlin-serialized GPTQ is not supported; expected false, got true")
    fmt = str(_alias(d, where, "format", ("format", "checkpoint_format")) or "gptq").lower()
    if fmt not in GPTQ_FORMATS:
        raise ValueError(f"{where}format: expected one of {', '.join(GPTQ_FORMATS)}, got {fmt!r}")
    sym = _sym(d, where)
    if sym is None:
        logger.warning("%ssym missing; assuming true as AutoGPTQ and GPTQModel do", where)
        sym = True
    desc_act = d.get("desc_act")
    return QuantSpec(
        method=QuantMethod.GPTQ,
        bits=_bits(d, where, GPTQ_BITS),
        group_size=_group_size(d, where),
        sym=sym,
        # Missing desc_act: treat g_idx as possibly non-monotonic (AutoGPTQ's default is true).
        act_order=True if desc_act is None else bool(desc_act),
        format=fmt,
    )


def _parse_awq(d: dict[str, Any], where: str) -> QuantSpec:
    _refuse_gptqmodel_extras(d, where)
    if str(d.get("backend", "")).lower() == "llm-awq":
        raise ValueError(f"{where}backend: llm-awq layout is not supported; expected autoawq")
    fmt = str(_alias(d, where, "version", ("version", "format", "checkpoint_format")) or "gemm").lower()
    if fmt not in AWQ_FORMATS:
        raise ValueError(f"{where}version: expected one of {', '.join(AWQ_FORMATS)}, got {fmt!r}")
    sym = _sym(d, where)
    return QuantSpec(
        method=QuantMethod.AWQ,
        bits=_bits(d, where, AWQ_BITS),
        group_size=_group_size(d, where),
        sym=False if sym is None else sym,  # AutoAWQ's default is zero_point: true
        act_order=False,
        format=fmt,
        ignore=tuple(d.get("modules_to_not_convert") or ()),
    )


def _parse_compressed_tensors(d: dict[str, Any], where: str) -> QuantSpec:
    for key in ("sparsity_config", "transform_config"):
        if d.get(key):
            raise ValueError(f"{where}{key}: not supported; expected empty, got {d[key]!r}")
    if d.get("kv_cache_scheme") is not None:
        raise ValueError(f"{where}kv_cache_scheme: KV-cache quantization is not supported; expected null")
    status = d.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(f"{where}quantization_status: expected 'compressed', got {status!r}")
    groups = d.get("config_groups") or {}
    linear = [name for name, g in groups.items() if "Linear" in (g.get("targets") or [])]
    if len(linear) != 1 or len(groups) != 1:
        raise ValueError(
            f"{where}config_groups: expected exactly one group targeting 'Linear', got {len(groups)} groups "
            f"({len(linear)} targeting 'Linear'); per-module schemes are not supported"
        )
    name = linear[0]
    group, at = groups[name], f"{where}config_groups.{name}."
    fmt = group.get("format") or d.get("format")
    if fmt != CT_FORMAT:
        raise ValueError(f"{at}format: expected {CT_FORMAT!r}, got {fmt!r}")
    for key in ("input_activations", "output_activations"):
        if group.get(key) is not None:
            raise ValueError(f"{at}{key}: activation quantization is not supported; expected null")
    w = group.get("weights")
    if not isinstance(w, dict):
        raise ValueError(f"{at}weights: expected an object, got {w!r}")
    if w.get("type", "int") != "int":
        raise ValueError(f"{at}weights.type: expected 'int', got {w['type']!r}")
    if w.get("dynamic"):
        raise ValueError(f"{at}weights.dynamic: expected false, got {w['dynamic']!r}")
    if w.get("block_structure") is not None:
        raise ValueError(f"{at}weights.block_structure: expected null, got {w['block_structure']!r}")
    bits = w.get("num_bits")
    if bits not in CT_BITS:
        raise ValueError(f"{at}weights.num_bits: expected one of {', '.join(map(str, CT_BITS))}, got {bits!r}")
    gs = w.get("group_size")
    strategy = w.get("strategy") or ("tensor" if gs is None else "channel" if gs == -1 else "group")
    if strategy == "channel":
        gs = -1
    elif strategy != "group":
        raise ValueError(f"{at}weights.strategy: expected 'group' or 'channel', got {strategy!r}")
    if gs not in GROUP_SIZES:
        raise ValueError(f"{at}weights.group_size: expected one of {', '.join(map(str, GROUP_SIZES))}, got {gs!r}")
    # formats.md T19: "group"/"dynamic"/true write weight_g_idx; "weight"/"static"/null do not.
    actorder = w.get("actorder")
    if actorder in ("group", "dynamic", True):
        act_order = True
    elif actorder in (None, "weight", "static", False):
        act_order = False
    else:
        raise ValueError(f"{at}weights.actorder: expected null, 'weight', 'static', 'group' or 'dynamic', got {actorder!r}")
    return QuantSpec(
        method=QuantMethod.COMPRESSED_TENSORS,
        bits=bits,
        group_size=gs,
        sym=bool(w.get("symmetric", True)),
        act_order=act_order,
        format=CT_FORMAT,
        ignore=tuple(d.get("ignore") or ()),
    )


def _refuse_gptqmodel_extras(d: dict[str, Any], where: str) -> None:
    """GPTQModel keys that change tensor sets or layouts (T18)."""
    if d.get("dynamic"):
        raise ValueError(f"{where}dynamic: per-module overrides are not supported; expected empty, got {d['dynamic']!r}")
    if d.get("lm_head"):
        raise ValueError(f"{where}lm_head: a quantized lm_head is not supported; expected false, got true")
    pack_dtype = d.get("pack_dtype", "int32")
    if pack_dtype != "int32":
        raise ValueError(f"{where}pack_dtype: expected 'int32', got {pack_dtype!r}")
    for key in ("activation", "rotation", "adapter"):
        if d.get(key) is not None:
            raise ValueError(f"{where}{key}: not supported; expected null, got {d[key]!r}")


def _alias(d: dict[str, Any], where: str, canonical: str, names: tuple[str, ...]) -> Any:
    """The value under any of `names`; two aliases with different values are refused."""
    present = {n: d[n] for n in names if d.get(n) is not None}
    values = {str(v).lower() if isinstance(v, str) else v for v in present.values()}
    if len(values) > 1:
        listed = ", ".join(f"{n}={v!r}" for n, v in present.items())
        raise ValueError(f"{where}{canonical}: aliases disagree ({listed})")
    return next(iter(present.values()), None)


def _bits(d: dict[str, Any], where: str, allowed: tuple[int, ...]) -> int:
    bits = _alias(d, where, "bits", ("bits", "w_bit", "wbits"))
    if bits not in allowed or isinstance(bits, bool):
        raise ValueError(f"{where}bits: expected one of {', '.join(map(str, allowed))}, got {bits!r}")
    return bits


def _group_size(d: dict[str, Any], where: str) -> int:
    # Required: AutoGPTQ (-1) and GPTQModel (128) default differently (T14), so never guess.
    gs = _alias(d, where, "group_size", ("group_size", "q_group_size"))
    if gs not in GROUP_SIZES or isinstance(gs, bool):
        raise ValueError(f"{where}group_size: expected one of {', '.join(map(str, GROUP_SIZES))}, got {gs!r}")
    return gs


def _sym(d: dict[str, Any], where: str) -> bool | None:
    sym = d.get("sym")
    zero_point = d.get("zero_point")
    if sym is not None and zero_point is not None and bool(sym) == bool(zero_point):
        raise ValueError(f"{where}sym: sym={sym!r} contradicts zero_point={zero_point!r}")
    if sym is not None:
        return bool(sym)
    return None if zero_point is None else not zero_point


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
