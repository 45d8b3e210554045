"""edgellm.quant: checkpoint formats <-> QuantizedWeight, and the quantizers."""
