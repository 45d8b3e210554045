"""SafetensorsReader: tensor name -> shard file, read one tensor at a time.

Which files hold the weights (formats.md §1.8):

    *.safetensors.index.json present   its weight_map names every tensor's shard
    otherwise                          the *.safetensors files; when there are several
                                       (a model folder may also carry e.g. a reference
                                       file), the one holding `model.layers.*` tensors

Files are opened with `safe_open` (memory-mapped): reading a tensor copies only that
tensor, so the checkpoint is never held twice. Every safetensors error is re-raised as
one line naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType

from safetensors import SafetensorError, safe_open
from torch import Tensor

WEIGHT_PREFIX = "model.layers."
FLOAT_DTYPES = ("F16", "BF16", "F32")  # safetensors dtype strings a dense weight may have


class SafetensorsReader:
    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self._handles: dict[Path, object] = {}
        self.files: dict[str, Path] = self._index()  # tensor name -> file

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()  # safe_open handles unmap when dropped

    def names(self) -> set[str]:
        return set(self.files)

    def describe(self, name: str) -> tuple[list[int], str]:
        """(shape, safetensors dtype string such as 'F16') from the header, without reading data."""
        path = self.files[name]
        try:
            sl = self._open(path).get_slice(name)
            return list(sl.get_shape()), sl.get_dtype()
        except SafetensorError as e:
            raise ValueError(f"{path}: {name}: corrupt safetensors ({e})") from None

    def read(self, name: str) -> Tensor:
        path = self.files[name]
        try:
            return self._open(path).get_tensor(name)
        except SafetensorError as e:
            raise ValueError(f"{path}: {name}: corrupt safetensors ({e})") from None

    def where(self, name: str) -> str:
        """The file holding `name`, for error messages."""
        return str(self.files[name])

    def _open(self, path: Path):
        handle = self._handles.get(path)
        if handle is None:
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except SafetensorError as e:
                raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
            except OSError as e:
                raise FileNotFoundError(f"{path}: cannot open ({e.strerror})") from None
            self._handles[path] = handle
        return handle

    def _keys(self, path: Path) -> list[str]:
        return list(self._open(path).keys())

    def _index(self) -> dict[str, Path]:
        indexes = sorted(self.model_dir.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            raise ValueError(f"{self.model_dir}: {len(indexes)} *.safetensors.index.json files; expected one")
        if indexes:
            return self._from_index(indexes[0])
        files = sorted(self.model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{self.model_dir}: no *.safetensors file")
        if len(files) > 1:
            files = [f for f in files if any(k.startswith(WEIGHT_PREFIX) for k in self._keys(f))]
            if len(files) != 1:
                names = ", ".join(f.name for f in files) or "none"
                raise ValueError(f"{self.model_dir}: expected one *.safetensors file with {WEIGHT_PREFIX}* tensors, found {names}")
        return {name: files[0] for name in self._keys(files[0])}

    def _from_index(self, index: Path) -> dict[str, Path]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: expected JSON with a 'weight_map' object ({e!r})") from None
        files: dict[str, Path] = {}
        for name, shard in weight_map.items():
            path = self.model_dir / shard
            if not path.is_file():
                raise FileNotFoundError(f"{index}: weight_map names shard {shard} for {name}, which does not exist")
            files[name] = path
        for path in set(files.values()):
            keys = set(self._keys(path))
            listed = {n for n, p in files.items() if p == path}
            if listed - keys:
                missing = sorted(listed - keys)[0]
                raise ValueError(f"{path}: {missing}: listed in {index.name} but not in the shard")
            for extra in keys - listed:
                # A tensor in a shard but not in the map is still part of the checkpoint.
                files.setdefault(extra, path)
        return files

