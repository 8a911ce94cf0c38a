"""Calibration over several processes with ``torch.distributed`` (``torchrun``): the rank's context
(``DistContext``: which block of the batches it calibrates) and the collectives that fold all
ranks' statistics before the factors; the loop itself is ``loop.run_calibration``.

Why this shape: observer states are mergeable, so each rank calibrates a contiguous block of
batches, and before the factors every state is all-gathered and folded in rank order on one
owner rank per layer, which also computes that layer's factors. Rank order reproduces the
single-process order (IFMR exact is bit-identical). Only rank 0 writes files. The wire format is
plain tensors, no pickling. docs/distributed.md."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from amct_torch.calibration.loop import resolve_device, run_calibration
from amct_torch.errors import AmctError, CalibrationError

log = logging.getLogger("amct_torch.calibration")

#: dtypes that may appear in observer states (index = wire code)
_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool,
           torch.float16, torch.bfloat16)
_MAX_DIMS = 8


@dataclass
class DistContext:
    """Where this process stands in the job. ``device``: the device this rank calibrates on
    (``cuda:LOCAL_RANK`` with NCCL, else CPU); ``owns_group``: this module initialised the
    process group (and ``shutdown`` destroys it)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = "none"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False
    #: bytes this rank put into collectives, per calibration group (first layer name)
    bytes_sent: dict[str, int] = field(default_factory=dict)

    @property
    def is_writer(self) -> bool:
        """Only rank 0 writes the record and the models."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def block(self, n_batches: int) -> tuple[int, int]:
        """``[start, stop)`` of the first ``n_batches`` batches this rank calibrates."""
        return shard_range(n_batches, self.rank, self.world_size)

    def fold(self, session: Any) -> None:
        """What the calibration loop does between the last batch and the factors: fold every
        rank's statistics and compute the factors on the owner ranks (``reduce_and_compute``),
        and give every rank the input shapes. Nothing in one process. ``bytes_sent`` then
        counts this fold's collectives."""
        self.bytes_sent.clear()
        reduce_and_compute(session, self)
        _share_shapes(session, self)


def launched_by_torchrun() -> bool:
    """Whether the environment of a ``torchrun`` worker is present (WORLD_SIZE and RANK)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_distributed(device: Optional[str] = None, backend: Optional[str] = None) -> DistContext:
    """Join (or reuse) the default process group of a ``torchrun`` job.

    ``device`` "cpu" forces gloo on CPU; "cuda"/None/"auto" use NCCL on ``cuda:LOCAL_RANK``
    when CUDA is present, else gloo on CPU. Outside torchrun (no WORLD_SIZE/RANK) this is a
    one-process context and nothing is initialised."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        be = str(dist.get_backend())
        local = int(os.environ.get("LOCAL_RANK", rank))
        dev = torch.device(f"cuda:{local}") if be == "nccl" else torch.device("cpu")
        return DistContext(rank, world, local, be, dev, owns_group=False)
    if not launched_by_torchrun():
        return DistContext(device=resolve_device(device))
    if not dist.is_available():
        raise AmctError("torch.distributed is not available in this PyTorch build")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    want_cuda = device not in ("cpu",) and torch.cuda.is_available() and \
        (device is None or device == "auto" or str(device).startswith("cuda"))
    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        raise AmctError(f"device {device!r} requested but CUDA is not available")
    be = backend or ("nccl" if want_cuda else "gloo")
    if be == "nccl":
        if local >= torch.cuda.device_count():
            raise AmctError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA device(s)")
        dev = torch.device(f"cuda:{local}")
        torch.cuda.set_device(dev)
        try:
            dist.init_process_group("nccl", device_id=dev)
        except TypeError:  # torch < 2.3 has no device_id
            dist.init_process_group("nccl")
    else:
        dev = torch.device("cpu")
        dist.init_process_group(be)
    ctx = DistContext(dist.get_rank(), dist.get_world_size(), local, be, dev, owns_group=True)
    import atexit
    atexit.register(shutdown, ctx)  # a clean exit for callers (quantize, the CLI) that do not
    log.info("distributed calibration: rank %d of %d (%s on %s)", ctx.rank, ctx.world_size, be, dev)
    return ctx


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group if ``init_distributed`` created it."""
    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()
        ctx.owns_group = False


def shard_range(n_batches: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of the contiguous block of batches rank ``rank`` calibrates on: the
    first ``n % world`` ranks get one batch more (rank 0 always has one when n ≥ 1)."""
    base, extra = divmod(int(n_batches), int(world_size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


# -- collectives on tensors ---------------------------------------------------------------
def _gather_fixed(t: torch.Tensor, ctx: DistContext, key: str) -> list[torch.Tensor]:
    t = t.to(ctx.device).contiguous()
    out = [torch.empty_like(t) for _ in range(ctx.world_size)]
    dist.all_gather(out, t)
    ctx.bytes_sent[key] = ctx.bytes_sent.get(key, 0) + t.numel() * t.element_size()
    return out


def _gather_header(t: Optional[torch.Tensor], ctx: DistContext, key: str) -> list[Optional[tuple]]:
    """Everyone's (dtype code, shape) for one tensor (None where a rank has none)."""
    h = torch.full((2 + _MAX_DIMS,), -1, dtype=torch.int64)
    if t is not None:
        if t.dim() > _MAX_DIMS or t.dtype not in _DTYPES:
            raise CalibrationError(f"observer state tensor {tuple(t.shape)} {t.dtype} cannot be sent")
        h[0], h[1] = _DTYPES.index(t.dtype), t.dim()
        h[2:2 + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
    out = []
    for g in _gather_fixed(h, ctx, key):
        row = g.cpu().tolist()
        out.append(None if row[0] < 0 else (_DTYPES[row[0]], tuple(row[2:2 + row[1]])))
    return out


def all_gather_tensor(t: Optional[torch.Tensor], ctx: DistContext, key: str = "") -> list[Optional[torch.Tensor]]:
    """Every rank's tensor (any shape; ``None`` = this rank has none), on CPU, in rank order.
    Payloads are padded to the largest one; bytes sent are counted under ``key``."""
    heads = _gather_header(t, ctx, key)
    present = [h for h in heads if h is not None]
    if not present:
        return [None] * ctx.world_size
    dtype = present[0][0]
    if any(h[0] != dtype for h in present):
        raise CalibrationError("ranks disagree on an observer state's dtype", layer=key or None)
    size = max(int(torch.Size(h[1]).numel()) for h in present)
    wire = torch.bool if dtype == torch.bool else dtype
    buf = torch.zeros(size, dtype=torch.uint8 if wire == torch.bool else wire)
    if t is not None:
        flat = t.detach().reshape(-1)
        buf[:flat.numel()] = flat.to(buf.dtype).cpu()
    got = _gather_fixed(buf, ctx, key)
    out: list[Optional[torch.Tensor]] = []
    for h, g in zip(heads, got):
        if h is None:
            out.append(None)
            continue
        n = int(torch.Size(h[1]).numel())
        out.append(g[:n].cpu().to(dtype).reshape(h[1]))
    return out


def _all_gather_each(t: torch.Tensor, ctx: DistContext, key: str) -> list[torch.Tensor]:
    """``all_gather_tensor`` where every rank passes a tensor."""
    got = all_gather_tensor(t, ctx, key)
    missing = [r for r, g in enumerate(got) if g is None]
    if missing:
        raise CalibrationError(f"rank {missing[0]} sent no {key} tensor")
    return [g for g in got if g is not None]


def _all_gather_keys(keys: Sequence[str], ctx: DistContext, key: str) -> list[str]:
    """The sorted union of every rank's state keys."""
    raw = torch.tensor(list("\n".join(keys).encode()), dtype=torch.uint8)
    union: set[str] = set()
    for g in all_gather_tensor(raw, ctx, key):
        if g is not None and g.numel():
            union.update(bytes(g.tolist()).decode().split("\n"))
    return sorted(union)


def gather_states(state: dict[str, torch.Tensor], ctx: DistContext, key: str = "") -> list[dict[str, torch.Tensor]]:
    """Every rank's ``state_dict`` (CPU tensors), in rank order."""
    keys = _all_gather_keys(list(state), ctx, key)
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(ctx.world_size)]
    for k in keys:
        for r, t in enumerate(all_gather_tensor(state.get(k), ctx, key)):
            if t is not None:
                out[r][k] = t
    return out


def _fold(obs: Any, states: Sequence[dict[str, torch.Tensor]], dev: Optional[torch.device]) -> None:
    """``obs`` := merge of ``states`` in order (``reset()`` then ``merge`` of each)."""
    import copy

    obs.reset()
    for sd in states:
        part = copy.copy(obs)
        part.load_state_dict({k: v.to(dev) if dev is not None else v for k, v in sd.items()})
        obs.merge(part)


class _Computed:
    """Stands in for an observer whose factors were computed on another rank."""

    def __init__(self, scale: float, offset: int) -> None:
        self.scale, self.offset = scale, offset

    def compute(self) -> tuple[float, int]:
        return self.scale, self.offset


def reduce_and_compute(session: Any, ctx: DistContext) -> None:
    """Fold each group's states (all ranks', in rank order) on its owner rank (group i → rank
    i mod world), compute its factors there, and share the factors: the fold and the factor
    search — the costly part for HFMG and IFMR — are split over the ranks instead of repeated
    on each. Afterwards every session's observers report the shared factors, so
    ``session.finish()`` gives the same record on every rank. An error on an owner (NaN data,
    a layer that saw no data) is raised on every rank with the owner's message."""
    if not ctx.active:
        return
    groups = session.groups
    names = [g.layers[0] for g in groups]
    out = torch.zeros(len(groups), 2, dtype=torch.float64)
    errors: dict[int, str] = {}
    owned: dict[int, list] = {}
    # all collectives first, then the owners compute without waiting on each other
    for i, (obs, name) in enumerate(zip(session.observers, names)):
        ctx.bytes_sent.pop(name, None)
        states = gather_states(obs.state_dict(), ctx, name)
        if i % ctx.world_size == ctx.rank:
            owned[i] = states
        else:
            obs.reset()  # free the statistics: the owner computes
    for i, states in owned.items():
        obs = session.observers[i]
        try:
            _fold(obs, states, _state_device(obs) or ctx.device)
            scale, offset = obs.compute()
            out[i, 0], out[i, 1] = float(scale), float(offset)
        except AmctError as err:
            errors[i] = str(err)
        except (RuntimeError, ValueError) as err:
            errors[i] = f"cannot compute activation factors: {err}"
    import json

    msgs = all_gather_tensor(torch.tensor(list(json.dumps(errors).encode()), dtype=torch.uint8), ctx, "factors")
    for m in msgs:
        bad = json.loads(bytes(m.tolist()).decode()) if m is not None else {}
        if bad:
            i = min(int(k) for k in bad)
            raise CalibrationError(f"on rank {i % ctx.world_size}: {bad[str(i)]}", layer=names[i])
    for r, t in enumerate(_all_gather_each(out, ctx, "factors")):
        for i in range(r, len(groups), ctx.world_size):
            session.observers[i] = _Computed(float(t[i, 0]), int(t[i, 1]))


def _state_device(obs: Any) -> Optional[torch.device]:
    """Where the observer keeps its statistics (None when it has none yet)."""
    for t in obs.state_dict().values():
        if t.numel() > 1:
            return t.device
    return None


# -- the calibration loop of a rank ------------------------------------------------------
def run_sharded_calibration(model: nn.Module, session: Any, batches: Iterable[Any], ctx: DistContext,
                            quiet: bool = True, checkpoint: Optional[str] = None) -> Iterator[Any]:
    """The calibration loop (``loop.run_calibration``) as rank ``ctx.rank``: this rank's block
    of the first ``session.batch_num`` batches of ``batches`` (every rank passes the same), the
    observers of all ranks folded, the session finished on every rank (its ``on_finish``
    should write only where ``ctx.is_writer``). ``checkpoint``: one file per rank (suffix
    ``.rankR`` when distributed). Returns the batches after the first ``batch_num``."""
    return run_calibration(model, session, batches, ctx.device, quiet, ctx=ctx, checkpoint=checkpoint)


def _share_shapes(session: Any, ctx: DistContext) -> None:
    """Give every rank the (C, H, W) of each group (a rank with no batch never saw them)."""
    if not ctx.active:
        return
    t = torch.tensor([list(g.shape) if g.shape is not None else [-1, -1, -1] for g in session.groups],
                     dtype=torch.int64).reshape(-1, 3)
    for g_t in _all_gather_each(t, ctx, "shapes"):
        for group, row in zip(session.groups, g_t.tolist()):
            if group.shape is None and not group.joint and row[0] >= 0:
                group.shape = tuple(int(v) for v in row)


def rank_output(path: str, ctx: DistContext) -> str:
    """``path`` on rank 0; on other ranks the same file name in a private temporary folder
    (removed at exit), so AMCT-workflow scripts can pass the same paths on every rank while
    only rank 0 writes where the user looks."""
    if ctx.is_writer:
        return path
    import atexit
    import shutil
    import tempfile

    global _PRIVATE
    if _PRIVATE is None:
        _PRIVATE = tempfile.mkdtemp(prefix=f"amct_rank{ctx.rank}_")
        atexit.register(shutil.rmtree, _PRIVATE, True)
    return os.path.join(_PRIVATE, os.path.basename(os.fspath(path)))


_PRIVATE: Optional[str] = None
