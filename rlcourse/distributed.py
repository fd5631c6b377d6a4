"""Data parallelism for the RL loop: each process samples its share of a step's prompts.

Under ``accelerate launch`` (or ``torchrun``) every process runs the same :class:`~rlcourse.train.Trainer`
on a replica of the model. A step then goes:

1. every process draws the same global list of ``prompts_per_step`` prompts (the prompt sampler's
   generator is seeded alike in every process) and keeps its contiguous share (:meth:`Group.share`);
2. it samples, scores and estimates advantages for its own rows (groups never straddle processes);
3. the loss's denominators are **global**: the token count (or sequence count) of the whole step,
   summed over processes (:meth:`Group.sum`), so each process's loss is its part of the global sum;
4. after the backward pass the gradients are summed over processes (:meth:`Group.sum_gradients`),
   which makes every replica's gradient the gradient of the one global loss; each applies the same
   optimiser step, so the replicas stay equal.

Why global denominators: with ``R`` processes holding ``n_r`` response tokens each, the token-mean
loss of the whole step is ``sum_r S_r / sum_r n_r`` (``S_r`` the sum of per-token losses of process
``r``). Averaging the per-process token-means, ``(1/R) sum_r S_r / n_r``, which is what averaging the
gradients of locally normalised losses does, weighs a token of a process with short responses more
than a token of one with long responses; the two agree only when every ``n_r`` is equal.

What stays per process: the ``state`` of stateful parts (a prompt sampler's history, P-GRPO's reward
history) sees only that process's rows, and statistics of the whole batch (``scale_rewards="batch"``,
whitened advantages) are refused under data parallelism rather than computed from a share. Rank 0's
state is the one a checkpoint keeps.

This is what ``DistributedDataParallel`` computes (it averages gradients; we sum, because our
denominators are already global), without its overlap of communication with the backward pass:
clear rather than fast. The process group comes from :mod:`torch.distributed` (``gloo`` on CPU; on GPUs
a mixed group, ``nccl`` for CUDA tensors and ``gloo`` for the CPU scalars, see :func:`choose_backend`);
:func:`init_from_env` starts it from the variables a launcher sets.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    """The processes of a data-parallel run (``world_size == 1``: a plain run; every call is a no-op).

    ==========  ==========================================================
    rank        this process's index, ``0 .. world_size - 1``
    world_size  the number of processes
    ==========  ==========================================================
    """

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints and logs."""
        return self.rank == 0

    def share(self, n: int) -> slice:
        """This process's contiguous share of ``n`` items (the first ``n % world_size`` processes get
        one more). Fewer items than processes is a ValueError: a process with nothing to sample
        would have no rows to train on."""
        if n < self.world_size:
            raise ValueError(f"{n} prompts per step cannot be shared by {self.world_size} processes: "
                             f"give at least one prompt per process (prompts_per_step >= {self.world_size})")
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def sum(self, value: float) -> float:
        """``value`` summed over processes."""
        if self.world_size == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item())

    def reduce_metrics(self, values: dict, summed: Iterable[str] = (), keep: Iterable[str] = ()) -> dict:
        """``values`` with each numeric entry averaged over processes, or summed for the keys in
        ``summed`` (counts, and parts of a global sum); keys in ``keep`` and non-numbers unchanged.

        Processes may log different keys (with ``beta = 0`` a process whose groups all had equal
        rewards trains no rows, so it has no clipping metrics): the reduction runs over the union of
        every process's keys, in one agreed order (:func:`metric_keys`), and a key is averaged over
        the processes that logged it (a missing key adds nothing to a sum)."""
        if self.world_size == 1:
            return values
        summed, keep = set(summed), set(keep)
        mine = metric_keys(values, keep)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        keys = sorted(set().union(*gathered))
        t = torch.tensor([[float(values[k]) if k in mine else 0.0 for k in keys],
                          [1.0 if k in mine else 0.0 for k in keys]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        out = dict(values)
        for key, total, count in zip(keys, t[0].tolist(), t[1].tolist()):
            out[key] = total if key in summed else total / count
            if key in summed and isinstance(values.get(key), int):
                out[key] = int(round(total))
        return out

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum the ``.grad`` of every trainable parameter over processes, in place. A parameter
        without a gradient on this process (its rows were all skipped) contributes zeros."""
        if self.world_size == 1:
            return
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1).to(torch.float32) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def current() -> Group:
    """The data-parallel group of this process: torch.distributed's, when it is initialised."""
    if dist.is_available() and dist.is_initialized():
        return Group(rank=dist.get_rank(), world_size=dist.get_world_size())
    return Group()


def metric_keys(values: dict, keep: Iterable[str] = ()) -> list[str]:
    """The sorted keys of ``values`` that :meth:`Group.reduce_metrics` reduces: numbers (not bools)
    outside ``keep``."""
    keep = set(keep)
    return sorted(k for k, v in values.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in keep)


def choose_backend(cuda: bool) -> str:
    """The process-group backend for a machine with or without CUDA.

    With CUDA the group is mixed, ``"cpu:gloo,cuda:nccl"``: gradients (on the GPU) go through NCCL,
    while the few scalars the loop reduces (denominators, metrics, on the CPU) go through gloo; a
    plain ``"nccl"`` group has no backend for CPU tensors. Without CUDA, ``"gloo"``."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


def init_from_env(backend: str | None = None, timeout_minutes: float = 60.0) -> Group:
    """Start the process group from the variables ``accelerate launch`` / ``torchrun`` set
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``); a plain ``python``
    run (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) stays a single process. ``backend`` defaults to
    :func:`choose_backend`'s. With CUDA, each process takes the GPU of its ``LOCAL_RANK`` before
    the group starts, so NCCL binds to that device. ``timeout_minutes`` bounds how long a collective
    waits: the other processes wait in their first one while rank 0 evaluates the base model, which
    at the full profile's size can outlast NCCL's default of 10 minutes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise ValueError(f"WORLD_SIZE={world} but {missing} are not set: start the run with "
                             "`accelerate launch` or `torchrun`")
        cuda = torch.cuda.is_available()
        backend = backend or choose_backend(cuda)
        if cuda and "nccl" in backend:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=timeout_minutes))
    return current()
