"""How the maths runs on a machine: memory probes, sliced element-wise passes, activation checkpointing and data
parallelism — what mask learning (``method``) needs to fit a model's memory and use several processes, kept apart so
that ``method`` reads as the paper.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import re
import sys
from typing import Callable, Iterable, Iterator

import torch

from . import errors
from .errors import ModelError


class DataParallel:
    """Mask learning over several processes (``torch.distributed``, e.g. under ``accelerate launch``).

    Each process scores its rows of the same global batch; the region-logit gradients are summed
    across processes, weighted by each process's share of the rows, so every process takes the
    step one process would take on the whole batch and all keep identical logits.
    """

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def shard(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
        rows = next(iter(batch.values())).shape[0]
        mine = torch.arange(rows)[self.rank::self.size]
        return {k: v[mine] for k, v in batch.items()}, mine.numel() / rows

    def reduce(self, grads, share: float, loss: torch.Tensor, need_peak: bool):
        import torch.distributed as dist

        sq = torch.zeros((), dtype=torch.float64)
        peak = torch.zeros((), dtype=torch.float32)
        with torch.no_grad():
            for g in grads:
                g.mul_(share)
                dist.all_reduce(g)
                flat = g.view(-1).float()
                sq += torch.dot(flat, flat).double().cpu()
                if need_peak:
                    peak = torch.maximum(peak, g.abs().max().float().cpu())
            total = (loss * share).reshape(1).float()
            dist.all_reduce(total)
        return (sq, peak), total[0]

    def agree(self, values: list[float]) -> list[float]:
        """Rank 0's ``values`` in every process: figures each process measured on the same whole batch, which a
        GPU's kernels need not reproduce to the last bit, so that all take the same step."""
        import torch.distributed as dist

        on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        shared = torch.tensor(values, dtype=torch.float64, device=on)
        dist.broadcast(shared, src=0)
        return shared.tolist()


def data_parallel() -> DataParallel | None:
    """The process group mask learning runs in, when started as several processes (WORLD_SIZE > 1)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available():
        return None
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_leave_group)
    return DataParallel(dist.get_rank(), dist.get_world_size())


def _leave_group() -> None:
    """Wait for every process, then close the group: a process that exits with its group open can be aborted by its
    transport's threads while another still holds the connection (a gloo run ended in SIGABRT this way)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_memory(device: torch.device) -> int:
    """Bytes that can still be allocated on ``device``; 0 where that is unknown (then "auto" stays lean).

    On CPU: the system's available memory, or less where the process's cgroup (v2 or v1) sets a
    limit; page cache the kernel can drop (inactive files) counts as free, as in MemAvailable.
    """
    if device.type == "cuda":
        reusable = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + reusable
    if device.type != "cpu":
        return 0
    try:
        with open("/proc/meminfo") as fh:
            free = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration):
        return 0
    for limit in cgroup_room():
        free = min(free, limit)
    return max(free, 0)


def placement(model: torch.nn.Module) -> str:
    """Where a model's parameters live and in what precision: "cpu float32 0.54 GB", one entry per device."""
    held: dict[tuple[str, str], int] = {}
    for p in model.parameters():
        key = (str(p.device), str(p.dtype).replace("torch.", ""))
        held[key] = held.get(key, 0) + p.numel() * p.element_size()
    return ", ".join(f"{device} {dtype} {size / 1e9:.2f} GB" for (device, dtype), size in sorted(held.items()))


def memory_in_use(device: torch.device | str = "cpu") -> str:
    """What the process holds now and at most so far: resident memory on CPU, allocated memory on a GPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return (f"{device}: {torch.cuda.memory_allocated(device) / 1e9:.2f} GB allocated "
                f"(peak {torch.cuda.max_memory_allocated(device) / 1e9:.2f} GB)")
    try:
        with open("/proc/self/status") as fh:
            status = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh if line.startswith(("VmRSS", "VmHWM"))}
    except (OSError, ValueError, IndexError):
        return "cpu: resident memory unknown"
    return f"cpu: {status.get('VmRSS', 0) / 1e9:.2f} GB resident (peak {status.get('VmHWM', 0) / 1e9:.2f} GB)"


def cgroup_room(proc: str = "/proc/self/cgroup", mounts: str = "/sys/fs/cgroup") -> Iterator[int]:
    """Room left under the memory limits of this process's cgroups (none where there is no limit)."""
    try:
        with open(proc) as fh:
            lines = [line.strip().split(":", 2) for line in fh if line.count(":") >= 2]
    except OSError:
        return
    for _, controllers, path in lines:
        if controllers == "":  # v2: limit, usage, and "inactive_file" in memory.stat
            files, root = ("memory.max", "memory.current", "inactive_file"), mounts
        elif "memory" in controllers.split(","):
            files, root = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"), f"{mounts}/memory"
        else:
            continue
        for folder in dict.fromkeys([f"{root}{path}".rstrip("/"), root]):  # a container may not mount the named path
            try:
                with open(f"{folder}/{files[0]}") as fh:
                    limit = fh.read().strip()
                with open(f"{folder}/{files[1]}") as fh:
                    used = int(fh.read())
                with open(f"{folder}/memory.stat") as fh:
                    cache = next((int(line.split()[1]) for line in fh if line.startswith(files[2] + " ")), 0)
            except (OSError, ValueError, IndexError):
                continue
            if limit.isdigit() and int(limit) < 1 << 60:  # v1 says "no limit" with a huge number, v2 with "max"
                yield int(limit) - used + cache
            break


def checkpointable_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' repeated layers, found anywhere in ``model`` (a prompt or a joint loss wraps the model)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ModelError(f"{type(model).__name__} has no layers transformers can checkpoint; "
                         "learn without --checkpoint-every")
    return layers


def checkpoint_layers(model: torch.nn.Module, layers: list[torch.nn.Module], every: int) -> Callable[[], None]:
    """Checkpoint every ``every``-th layer: its activations are recomputed in the backward pass, not kept.

    Activations are what mask learning holds beyond its four copies of the graftable set; this
    trades them for one more forward pass of the checkpointed layers. Each chosen layer's forward
    is wrapped here rather than by transformers, which checkpoints only layers in training mode:
    many layers call dropout with their own training flag, and the mask, not noise, must explain
    the loss. The recomputation repeats the same operations, so the gradients and the region are
    those of the plain pass. Returns the undo.
    """
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    def replayed(forward, *args, **kwargs):
        for cache in ("past_key_values", "layer_past"):  # a replayed layer would write its cache twice
            if kwargs.get(cache) is not None:
                kwargs[cache] = None
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)  # re-entrant ones drop frozen-input grads

    chosen = layers[::every]
    before = [layer.__dict__.get("forward") for layer in chosen]  # accelerate's device hooks live there
    for layer in chosen:
        layer.forward = partial(replayed, layer.forward)
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules()) if getattr(c, "use_cache", False)}
    for config in configs.values():  # no key/value cache in a training pass
        config.use_cache = False

    def undo() -> None:
        for layer, forward in zip(chosen, before):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward
        for config in configs.values():
            config.use_cache = True

    return undo


def return_freed_memory() -> None:
    """Hand memory that was freed back to the operating system (glibc's ``malloc_trim``; elsewhere nothing).

    Finding γ_base makes and frees temporaries the size of each tensor; glibc keeps much of that
    for reuse (0.2–0.3 model sizes at 1 B parameters, varying from run to run), where it would
    stay resident on top of everything mask learning holds. Trimming once takes tens of milliseconds.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except Exception:  # not glibc (musl has no malloc_trim): nothing to hand back this way
        pass


CHUNK = 1 << 20  # values per slice of an element-wise pass on CPU: its temporaries stay in cache, and small


_WHOLE = (slice(None),)


DEVICE_CHUNK = 1 << 26  # values per slice of a device's reduction that would otherwise widen all of them (int64)


def chunks(flat: torch.Tensor, everywhere: bool = False) -> Iterable[slice]:
    """Slices of a CPU pass over ``flat``; a GPU pass takes the whole tensor (a GPU pays per kernel launch
    and its caching allocator takes no fresh pages), or with ``everywhere`` slices of ``DEVICE_CHUNK`` (a count or
    a sum whose temporaries would be several times the tensor)."""
    n = flat.numel()
    size = CHUNK if flat.device.type == "cpu" else DEVICE_CHUNK if everywhere else n
    return _WHOLE if n <= size else [slice(i, min(i + size, n)) for i in range(0, n, size)]


def flat_views(sizes: dict[str, tuple[int, ...]], on: dict[str, torch.device], dtypes: dict[str, torch.dtype]):
    """(name -> view, device -> buffer): one buffer per device, cut in ``sizes``' order as ``initial_logits`` cuts
    ℓ, so that a position in one buffer is the same candidate in every other."""
    totals: dict[torch.device, int] = {}
    for n, shape in sizes.items():
        totals[on[n]] = totals.get(on[n], 0) + math.prod(shape)
    dtype: dict[torch.device, torch.dtype] = {}
    for n in sizes:  # a model that keeps some modules in float32 beside 16-bit ones: the wider on that device
        dtype[on[n]] = torch.promote_types(dtype.get(on[n], dtypes[n]), dtypes[n])
    flat = {d: torch.empty(total, dtype=dtype[d], device=d) for d, total in totals.items()}
    views, used = {}, dict.fromkeys(flat, 0)
    for n, shape in sizes.items():
        d, size = on[n], math.prod(shape)
        views[n] = flat[d][used[d]: used[d] + size].view(shape)
        used[d] += size
    return views, flat


def offset_in(view: torch.Tensor, buffer: torch.Tensor) -> int:
    """Where ``view`` starts inside ``buffer``, in elements."""
    return view.storage_offset() - buffer.storage_offset()


class Scratch:
    """Buffers reused by every tensor's temporaries (σ(ℓ), δ, the region count), each as large as
    the largest slice it has served (at most one chunk on CPU).

    Without them each step allocates and frees a few temporaries per tensor, and those of large
    tensors come as fresh zeroed pages from the operating system every time.
    """

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}

    def take(self, slot: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        key = (slot, dtype or like.dtype, like.device)
        if key not in self.buffers or self.buffers[key].numel() < like.numel():
            self.buffers[key] = torch.empty(like.numel(), dtype=key[1], device=like.device)
        return self.buffers[key][: like.numel()].view(like.shape)


# -- what fits --------------------------------------------------------------------------------------------------------
SHARE = 4  # a learner's own state may take a quarter of the memory free on a device: the rest is room for the step


def fits(need: dict[torch.device, int], share: int = SHARE) -> bool:
    """Whether each device's bytes take at most 1/``share`` of the memory free there (``share=1``: at all)."""
    return all(share * bytes_ <= free_memory(device) for device, bytes_ in need.items())


LARGE_BLOCK = 1 << 20  # bytes: blocks this large come from the system and go back to it when freed
COMMAND_BLOCK = 8 << 20  # the same for a command-line run from its start: a 330 M pair's defaults peaked at 2.16
# model sizes against 2.37 with glibc's dynamic threshold, in the same time (381 s and 384 s; bench_defaults.py)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_blocks(size: int = LARGE_BLOCK) -> None:
    """Serve every block of ``size`` bytes or more by its own mapping, unmapped as soon as it is freed.

    A mask step allocates and frees tensors the size of a weight or an activation (the candidate
    tensors' gradients, the recomputed layers' activations). glibc serves blocks under its dynamic
    threshold (which grows to 32 MiB after the first large free) from its heap and keeps their pages
    once freed; later steps scatter over that free space, so the heap stays resident at everything
    any step ever touched: 0.25 model sizes at 1 B parameters beyond what a step holds at once, more
    after ranking a LoRA pair, whose δ products fill the heap first. A fixed threshold maps each such
    block for its use only, for a page fault per page written. Process-wide, and kept: glibc has no
    way back to its dynamic threshold. Elsewhere than glibc nothing is done.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, size)
    except Exception:  # not glibc (musl has no mallopt): its allocator is left as it is
        pass


def maps_blocks(memory: str, params: dict[str, torch.nn.Parameter]) -> bool:
    """Whether a lean learner maps large blocks (``map_large_blocks``): with memory "lean", or "auto" when the
    model's tensors in CPU memory take more than a quarter of what is free there. The heap it spares is 0.2–0.25
    model sizes at 1 B; its price is every later step of the process, its own and any other work's, at 1.28× the
    time of a plain step on a 150m model (``benchmarks/bench_allocator.py``), where memory is not short."""
    if memory != "auto":
        return memory == "lean"
    cpu = sum(p.numel() * p.element_size() for p in params.values() if p.device.type == "cpu")
    return cpu > 0 and not fits({torch.device("cpu"): cpu})


def saved_activations(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                      trainable: Iterable[torch.nn.Parameter]) -> int:
    """Bytes the forward pass of ``batch`` keeps for the backward pass (a step's activations) when ``trainable`` take
    gradients: measured on the batch's first row and scaled by its rows, the tensors autograd saves, each storage
    once, the model's weights left out. No backward pass is run, and the model is left as it was."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor):  # kept until the pass is dropped, so that no storage is freed and reused
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    flags = {p: p.requires_grad for p in model.parameters()}
    ids = {id(p) for p in trainable}
    training = model.training
    device = next(model.parameters()).device
    rows = next(iter(batch.values())).shape[0]
    one = {key: value[:1].to(device) for key, value in batch.items()}
    try:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(id(p) in ids)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model(**one)
        del out
    finally:
        model.train(training)
        for p, flag in flags.items():
            p.requires_grad_(flag)
    return sum(seen.values()) * rows


# -- running out ----------------------------------------------------------------------------------------------------
def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is the host or a device running out of memory (torch says so in several ways)."""
    if errors.out_of_memory(err):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def asked_bytes(err: BaseException) -> int | None:
    """The allocation an out-of-memory error names ("Tried to allocate 52.00 GiB", "you tried to allocate N
    bytes"), in bytes; None where it names none."""
    text = str(err)
    found = re.search(r"tried to allocate ([0-9.]+) ?(bytes|[KMGT]i?B)", text, re.IGNORECASE)
    if not found:
        return None
    unit = found.group(2).upper().replace("I", "")
    scale = {"BYTES": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}.get(unit, 1)
    return int(float(found.group(1)) * scale)
