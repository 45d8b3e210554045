"""Checkpoint formats <-> QuantizedWeight, one module per producer layout.

`gptq`, `awq` and `compressed_tensors` each expose `to_internal(tensors, spec, prefix,
in_features, out_features)` and `from_internal(qw, spec)`; `bitpack` holds the bit-stream
packing and the shape checks they share. See docs/formats.md for the layouts.
"""
