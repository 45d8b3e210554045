"""load_model: a checkpoint directory -> CausalLM on a device, streamed one Linear at a time.

    config.json ──► ModelConfig                   (architecture, dims, rope)
                └─► detect_quant_spec ──► QuantSpec | None
    CausalLM built on the meta device             (no memory, no init)
    for each module, in model order:
        QuantLinear  read its tensors by prefix ──► dense [N, K]       ──► cast, to(device)
                                                └─► quantized suffixes ──► quant.formats.<method>.to_internal
                                                                           ──► QuantizedWeight.to(device)
        other        read `<module>.<param>`, check shape, cast to dtype, to(device)
    tied lm_head = embed_tokens; leftover tensors refused; nothing left on meta

Peak memory is the final model plus one Linear's tensors in flight: safetensors files are
memory-mapped, and each tensor is released as soon as it has been converted and moved.
Quantized scales keep the checkpoint's dtype inside `QuantizedWeight` (formats.md T7);
every other float tensor is cast to `dtype`.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import torch
from torch import Tensor, nn

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.loader.detect import detect_quant_spec
from edgellm.loader.safetensors_reader import FLOAT_DTYPES, SafetensorsReader
from edgellm.model.config import ModelConfig
from edgellm.model.layers import QuantLinear
from edgellm.model.llama import CausalLM
from edgellm.quant.spec import QuantMethod, QuantSpec

logger = logging.getLogger(__name__)

CONVERTERS = {
    QuantMethod.GPTQ: "edgellm.quant.formats.gptq",
    QuantMethod.AWQ: "edgellm.quant.formats.awq",
    QuantMethod.COMPRESSED_TENSORS: "edgellm.quant.formats.compressed_tensors",
}
QUANT_SUFFIXES = frozenset(
    {"qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"}
)
# Tensors some writers save that carry nothing a CausalLM needs.
HARMLESS_SUFFIXES = (".rotary_emb.inv_freq",)
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> CausalLM:
    """Build the model on the meta device and fill it from `path`'s safetensors, tensor by tensor."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: not a directory (expected a model folder with config.json)")
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"load_model dtype: expected float16, bfloat16 or float32, got {dtype}")
    config = ModelConfig.from_file(model_dir / "config.json")
    spec = detect_quant_spec(model_dir)
    with torch.device("meta"):
        model = CausalLM(config)
    with SafetensorsReader(model_dir) as reader:
        _WeightLoader(reader, spec, torch.device(device), dtype).load(model)
    logger.info(
        "loaded %s from %s: %s, %s on %s",
        config.architecture,
        model_dir,
        "float" if spec is None else f"{spec.method.value} {spec.bits}-bit g{spec.group_size}",
        dtype,
        device,
    )
    return model.eval()


class _WeightLoader:
    def __init__(self, reader: SafetensorsReader, spec: QuantSpec | None, device: torch.device, dtype: torch.dtype) -> None:
        self.reader = reader
        self.spec = spec
        self.device = device
        self.dtype = dtype
        # CPU backend: dequantize once at load, in the compute dtype (docs/loading.md).
        self.cache_dtype = dtype if device.type == "cpu" else None
        self.by_prefix: dict[str, dict[str, str]] = {}  # module prefix -> {suffix: tensor name}
        for name in reader.names():
            prefix, _, suffix = name.rpartition(".")
            self.by_prefix.setdefault(prefix, {})[suffix] = name
        self.consumed: set[str] = set()

    def load(self, model: CausalLM) -> None:
        for prefix, module in model.named_modules():
            if isinstance(module, QuantLinear):
                if prefix == "lm_head" and model.config.tie_word_embeddings:
                    self._tie_lm_head(model)
                else:
                    self._load_linear(prefix, module)
            else:
                for pname, param in list(module.named_parameters(recurse=False)):
                    full = f"{prefix}.{pname}" if prefix else pname
                    setattr(module, pname, nn.Parameter(self._read_dense(full, tuple(param.shape)), requires_grad=False))
        for module in model.modules():
            for bname, buf in list(module.named_buffers(recurse=False)):
                module._buffers[bname] = buf.to(self.device)
        self._check_leftovers()
        self._check_filled(model)

    def _load_linear(self, prefix: str, layer: QuantLinear) -> None:
        parts = self.by_prefix.get(prefix, {})
        quant = {s: n for s, n in parts.items() if s in QUANT_SUFFIXES}
        if quant:
            layer.load_quantized(self._read_quantized(prefix, quant, layer), self.cache_dtype)
        else:
            layer.load_dense(self._read_dense(f"{prefix}.weight", (layer.out_features, layer.in_features)))
        bias_name = f"{prefix}.bias"
        if layer.bias is not None:
            layer.load_bias(self._read_dense(bias_name, (layer.out_features,)))
        elif bias_name in self.reader.files:
            self._drop_zero_bias(bias_name)

    def _read_quantized(self, prefix: str, names: dict[str, str], layer: QuantLinear) -> QuantizedWeight:
        first = next(iter(names.values()))
        if self.spec is None:
            raise ValueError(f"{self.reader.where(first)}: {first} is a quantized tensor but config.json has no quantization_config")
        tensors = {suffix: self.reader.read(name) for suffix, name in names.items()}
        self.consumed.update(names.values())
        converter = importlib.import_module(CONVERTERS[self.spec.method])
        try:
            qw = converter.to_internal(tensors, self.spec, prefix, layer.in_features, layer.out_features)
        except ValueError as e:
            raise ValueError(f"{self.reader.where(first)}: {e}") from None
        return qw.to(self.device)

    def _read_dense(self, name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in self.reader.files:
            raise ValueError(f"{self.reader.model_dir}: missing tensor {name}, expected {list(shape)} float")
        found_shape, found_dtype = self.reader.describe(name)
        if tuple(found_shape) != shape or found_dtype not in FLOAT_DTYPES:
            raise ValueError(f"{self.reader.where(name)}: {name}: expected {list(shape)} float, got {found_shape} {found_dtype}")
        self.consumed.add(name)
        return self.reader.read(name).to(device=self.device, dtype=self.dtype)

    def _drop_zero_bias(self, name: str) -> None:
        # AutoGPTQ writes an all-zero bias for every quantized Linear (formats.md T15):
        # harmless, but a non-zero one means the checkpoint is not this architecture.
        bias = self.reader.read(name)
        if torch.count_nonzero(bias):
            raise ValueError(f"{self.reader.where(name)}: {name}: non-zero bias, but this architecture's layer has none")
        self.consumed.add(name)

    def _tie_lm_head(self, model: CausalLM) -> None:
        embed = model.model.embed_tokens.weight
        assert not embed.is_meta, "named_modules visits model.embed_tokens before lm_head"
        name = "lm_head.weight"
        if name in self.reader.files:
            # A tied checkpoint may still store the head (formats.md T9); it must be the embedding.
            head = self._read_dense(name, tuple(embed.shape))
            if not torch.equal(head, embed):
                raise ValueError(f"{self.reader.where(name)}: {name}: differs from model.embed_tokens.weight but tie_word_embeddings is true")
        model.lm_head.load_dense(embed)

    def _check_leftovers(self) -> None:
        extra = sorted(n for n in self.reader.names() - self.consumed if not n.endswith(HARMLESS_SUFFIXES))
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise ValueError(f"{self.reader.where(extra[0])}: unexpected tensor {extra[0]}{more}; not a parameter of this model")

    def _check_filled(self, model: CausalLM) -> None:
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            if t.is_meta:
                raise ValueError(f"{self.reader.model_dir}: {name} was never loaded")
        for name, m in model.named_modules():
            if isinstance(m, QuantLinear) and m.weight is None and m.qweight is None:
                raise ValueError(f"{self.reader.model_dir}: {name} has no weight")
