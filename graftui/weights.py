"""A checkpoint's tensors read lazily: memory-mapped safetensors files, a tensor at a time.

A pair needs θ_pre and θ_ft, but a verb touches them mostly at a region's k indices, or one tensor
at a time (a ranking by movement, a whole-model swap). Held whole they cost two more models of
memory; mapped from their files they cost what is read, and the operating system can drop those
pages again (they are clean: nothing is ever written back).

The format is read directly (8 bytes of header length, a JSON header, then the raw little-endian
data), so a tensor here is a view into the mapping, not a copy, and no pickle is ever involved.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator

import torch

from .errors import ModelError

DTYPES = {  # a safetensors header's dtype names
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_HEADER_CAP = 100 << 20  # a header larger than this is not a checkpoint's


def safetensors_files(folder: str | Path) -> list[Path]:
    """The weight files of a checkpoint folder: the shards its index names, else its *.safetensors."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ModelError(f"'{index}' is not a safetensors index ({err})") from err
        return [folder / s for s in shards]
    if (folder / "model.safetensors").exists():  # not its variants (model.fp16.safetensors, consolidated…)
        return [folder / "model.safetensors"]
    return sorted(folder.glob("*.safetensors"))


def _header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelError(f"'{path.name}' is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", head)
        if size > _HEADER_CAP:
            raise ModelError(f"'{path.name}' is not a safetensors file (header of {size:,} bytes)")
        try:
            header = json.loads(fh.read(size))
        except ValueError as err:
            raise ModelError(f"'{path.name}' is not a safetensors file (its header is not JSON)") from err
    if not isinstance(header, dict):
        raise ModelError(f"'{path.name}' is not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return 8 + size, header


class Checkpoint(Mapping):
    """name -> tensor of one checkpoint, each a read-only view of its memory-mapped file.

    ``rename`` maps the names a model uses to the names in the files (a wrapper's prefix); ``dtype``
    converts on read when the model runs in another precision than the file stores (a copy of that
    one tensor, made when it is read and dropped after). ``take`` reads a few values without
    touching the rest of the tensor's pages.
    """

    def __init__(self, files: list[Path], names: dict[str, str] | None = None, dtype: torch.dtype | None = None):
        self.files = [Path(f) for f in files]
        self.entries: dict[str, tuple[int, int, torch.dtype, tuple[int, ...]]] = {}  # file key -> (file, offset, …)
        self._maps: dict[int, mmap.mmap] = {}
        for i, path in enumerate(self.files):
            start, header = _header(path)
            size = path.stat().st_size
            for key, info in header.items():
                try:
                    dtype_ = DTYPES[info["dtype"]]
                    begin, end = (int(x) for x in info["data_offsets"])
                    shape = tuple(int(s) for s in info["shape"])
                except (KeyError, TypeError, ValueError) as err:
                    raise ModelError(f"'{path.name}': tensor '{key}' has a malformed entry ({err})") from err
                if not 0 <= begin <= end <= size - start or end - begin != math.prod(shape) * dtype_.itemsize:
                    raise ModelError(f"'{path.name}': tensor '{key}' points outside the file or has the wrong size")
                if key in self.entries:
                    raise ModelError(f"'{path.name}': tensor '{key}' is also in '{self.files[self.entries[key][0]].name}'")
                self.entries[key] = (i, start + begin, dtype_, shape)
        self.names = dict(names) if names is not None else {k: k for k in self.entries}
        self.dtype = dtype
        for i, path in enumerate(self.files):  # mapped now, not on first read: a pair is read from several threads
            with open(path, "rb") as fh:  # private (copy-on-write) mapping: read lazily, never written back
                self._maps[i] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)

    @classmethod
    def open(cls, folder: str | Path) -> "Checkpoint":
        files = safetensors_files(folder)
        if not files:
            raise ModelError(f"'{folder}' holds no safetensors weights")
        return cls(files)

    def renamed(self, names: dict[str, str], dtype: torch.dtype | None = None) -> "Checkpoint":
        """The same files under the model's names (``names``: model name -> file key)."""
        view = object.__new__(Checkpoint)
        view.files, view.entries, view._maps = self.files, self.entries, self._maps
        view.names, view.dtype = dict(names), dtype
        return view

    # -- Mapping -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    def stored(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """The dtype and shape ``name`` has in the file."""
        _, _, dtype, shape = self.entries[self.names[name]]
        return dtype, shape

    def numel(self, name: str) -> int:
        return math.prod(self.stored(name)[1])

    def _mapped(self, name: str) -> torch.Tensor:
        i, offset, dtype, shape = self.entries[self.names[name]]
        count = math.prod(shape)
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if offset % dtype.itemsize:  # not aligned for a view: copy this one tensor
                raw = torch.frombuffer(self._maps[i], dtype=torch.uint8, count=count * dtype.itemsize, offset=offset)
                return raw.clone().view(dtype).view(shape)
            return torch.frombuffer(self._maps[i], dtype=dtype, count=count, offset=offset).view(shape)

    def release(self, name: str | None = None) -> None:
        """Give back the pages read so far, of one tensor or of all (they are clean: a later read maps them in again
        from the file). A pass over the whole model that gives back each tensor's pages once it is done holds one
        tensor of the file at a time, not the file."""
        if name is None:
            for mapped in self._maps.values():
                mapped.madvise(mmap.MADV_DONTNEED)
            return
        i, offset, dtype, shape = self.entries[self.names[name]]
        if i not in self._maps:
            return
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the tensor only
        end = (offset + math.prod(shape) * dtype.itemsize) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._maps[i].madvise(mmap.MADV_DONTNEED, start, end - start)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        tensor = self._mapped(name)
        return tensor if self.dtype is None or tensor.dtype == self.dtype else tensor.to(self.dtype)

    def take(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """The values at flat ``index``: only their pages are read, and given back once copied (a scattered index
        touches most of a tensor's pages, which would otherwise stay resident)."""
        values = self._mapped(name).view(-1)[index.cpu()]  # a gather: a copy, not a view of the file
        self.release(name)
        return values if self.dtype is None else values.to(self.dtype)


def take(values: Mapping, name: str, index: torch.Tensor) -> torch.Tensor:
    """``values[name].view(-1)[index]``, read at those positions only when ``values`` can (a Checkpoint, an adapter)."""
    if hasattr(values, "take"):
        return values.take(name, index)
    flat = values[name].reshape(-1)
    return flat[index.to(flat.device)]


def release(values: Mapping, name: str | None = None) -> None:
    """``values.release(name)`` where ``values`` reads a file (a Checkpoint, an adapter's θ_ft); else nothing."""
    if hasattr(values, "release"):
        values.release(name)


class Placed(Mapping):
    """Values read where they live (a mapped file, an adapter's δ), each handed out on ``device`` when read.

    A lazy pair moved to a GPU moves its working model only: θ_pre and θ_ft stay mapped in host memory and
    a read copies one tensor (or, through ``take``, a few values) over, so the GPU holds one model, not three.
    """

    def __init__(self, values: Mapping, device: torch.device | str):
        self.source = values.source if isinstance(values, Placed) else values
        self.device = torch.device(device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)

    def __contains__(self, name) -> bool:
        return name in self.source

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.source[name].to(self.device)

    def numel(self, name: str) -> int:
        return self.source.numel(name) if hasattr(self.source, "numel") else self.source[name].numel()

    def take(self, name: str, index: torch.Tensor) -> torch.Tensor:
        return take(self.source, name, index).to(self.device)

    def release(self, name: str | None = None) -> None:
        release(self.source, name)


def model_names(params: dict[str, tuple[int, ...]], checkpoint: Checkpoint) -> tuple[dict[str, str], set[str]]:
    """(model name -> file key for the parameters the file holds with the same shape, the names it holds in another
    shape).

    A model read through a wrapper (``lm.``) or with a task head (``bert.``) names its tensors with a
    prefix its file may lack; one prefix depth, the one that matches most names, is used for all,
    so no name is matched to a tensor of another module by stripping too far.
    """
    best: tuple[dict[str, str], set[str]] = ({}, set())
    for depth in range(3):
        found, other = {}, set()
        for name, shape in params.items():
            parts = name.split(".")
            key = ".".join(parts[depth:])
            if len(parts) <= depth or key not in checkpoint.entries:
                continue
            if checkpoint.entries[key][3] == tuple(shape):
                found[name] = key
            else:
                other.add(name)
        if (len(found), -len(other)) > (len(best[0]), -len(best[1])):  # most matches, then fewest in other shapes
            best = (found, other)
    return best
