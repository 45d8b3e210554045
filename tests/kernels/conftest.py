"""Kernel tests: Triton runs under its interpreter (TRITON_INTERPRET=1) when there is no CUDA.

The interpreter turns a scalar into a 1-element NumPy array and implements `__index__` with
`int(array)`, which NumPy >= 2.4 refuses for arrays of ndim > 0 ("only 0-dimensional arrays can
be converted to Python scalars"); so a `range()` over a kernel argument fails. The shim below
takes the element instead; it touches nothing when Triton compiles for a GPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _patch_interpreter_index() -> None:
    try:
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    if not getattr(original, "_edgellm_shim", False):
        patched._edgellm_shim = True
        interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_interpreter_index()
