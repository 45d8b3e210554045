"""edgellm.kernels: compute on `QuantizedWeight` (torch and Triton only, no file formats)."""

from edgellm.kernels.qweight import QuantizedWeight

__all__ = ["QuantizedWeight"]
