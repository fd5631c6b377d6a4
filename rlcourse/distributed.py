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

:meth:`Group.sum_gradients` is what ``DistributedDataParallel`` computes (it averages gradients; we
sum, because our denominators are already global), without its overlap of communication with the
backward pass: clear rather than fast. :func:`engage` hands the same reduction to torch's engines
instead (an :class:`Engine`, chosen by name from ``PARALLEL``): ``"ddp"`` (``DistributedDataParallel``,
which reduces each bucket of gradients while the backward pass is still running) and ``"fsdp"``
(``fully_shard``, FSDP2: parameters, gradients and optimiser state sharded, each decoder layer
gathered when it runs). Both reduce during ``backward``, so every process must run as many passes as
the engine needs, even a process whose rows were all skipped (:meth:`Engine.start_update`,
:meth:`Engine.idle_pass`). The process group comes from :mod:`torch.distributed` (``gloo`` on CPU; on GPUs
a mixed group, ``nccl`` for CUDA tensors and ``gloo`` for the CPU scalars, see :func:`choose_backend`);
:func:`init_from_env` starts it from the variables a launcher sets, and :func:`finish` ends it (engines
first: a DDP wrapper that outlives its group can hang the process on its way out).
"""
from __future__ import annotations

import datetime
import gc
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
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
        if not params:
            return
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

    # the update's passes (the trainer calls these; a plain group reduces after backward, so it
    # needs no more passes than its own rows and nothing happens around them)
    def start_update(self, passes: int) -> int:
        """The update begins with ``passes`` forward/backward passes of this process's own rows;
        returns how many it runs in all (here ``passes``; an :class:`Engine` may ask for more)."""
        return passes

    def begin_pass(self, sync: bool) -> None:
        """Before a pass's forward: ``sync`` is whether its backward ends the accumulation."""

    def idle_pass(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sync: bool) -> None:
        """A pass of zero weight, for a process with fewer rows than the engine needs passes."""
        raise RuntimeError("a plain group runs no idle passes: start_update asked for none")


@dataclass(frozen=True, eq=False)
class Engine(Group):
    """A group whose gradients one of torch's engines reduces during ``backward`` (:func:`engage`).

    ========  =================================================================================
    parallel  ``"ddp"`` or ``"fsdp"`` (a key of ``PARALLEL``)
    module    what the training passes run: the ``DistributedDataParallel`` wrapper, or the
              model itself once ``fully_shard`` has sharded it in place
    ========  =================================================================================

    Every collective needs every process. DDP reduces once, in the backward of the pass with
    ``sync`` (the others accumulate locally, as under ``no_sync``), so each process runs at least
    one pass; FSDP gathers each layer in every forward and backward, so each process runs as many
    passes as the process with the most rows. A process that runs out of rows runs passes of zero
    weight (:meth:`idle_pass`): its gradient adds nothing, its collectives match the others'.
    """

    parallel: str = "ddp"
    module: torch.nn.Module | None = None
    _held: dict = field(default_factory=dict, repr=False)

    def start_update(self, passes: int) -> int:
        """Drop the weights :meth:`gather` held (FSDP), and return the passes every process runs."""
        self.release()
        if self.parallel == "ddp":
            return max(passes, 1)
        t = torch.tensor([max(passes, 1)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def begin_pass(self, sync: bool) -> None:
        """Whether this pass's backward reduces (DDP's ``no_sync`` and FSDP's
        ``set_requires_gradient_sync``, set before the forward, where DDP reads it)."""
        if self.parallel == "ddp":
            self.module.require_backward_grad_sync = sync
        else:
            self.module.set_requires_gradient_sync(sync)

    def idle_pass(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sync: bool) -> None:
        """A forward and backward over ``input_ids`` whose loss is the logits times zero: every
        trainable parameter gets a gradient of zeros, and every collective of a pass runs."""
        self.begin_pass(sync)
        out = self.module(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        (getattr(out, "logits", out).float().sum() * 0.0).backward()

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """The engine reduced its own parameters' gradients in backward; any other (a critic's) is
        summed as a plain group sums it."""
        managed = {id(p) for p in self.module.parameters()}
        super().sum_gradients([p for p in parameters if id(p) not in managed])

    def gather(self) -> None:
        """FSDP: gather every layer's full weights and keep them until :meth:`release`, so that
        sampling and the reference pass, whose numbers of forwards differ between processes, run
        without collectives. DDP: nothing (every process holds the full weights)."""
        if self.parallel != "fsdp" or self._held:
            return
        self._held["units"] = fsdp_units(self.module)
        for unit in self._held["units"]:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()

    def release(self) -> None:
        """Free what :meth:`gather` held (each process keeps its shard again)."""
        for unit in self._held.pop("units", ()):
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)

    @contextmanager
    def gathered(self):
        """:meth:`gather` for the block, then :meth:`release`."""
        self.gather()
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        """Let go of the engine's module (:func:`finish` calls it; the engine runs no pass after).

        ``DistributedDataParallel``'s reducer holds the process group, and its destructor keeps
        the GIL. Freed after ``destroy_process_group``, it destroys the group itself, and waits
        for gloo's worker threads while one of them waits for the GIL to free a tensor of a finished
        collective: both processes hang. Freed first, it leaves the group to
        ``destroy_process_group``, whose destructor releases the GIL."""
        self.release()
        object.__setattr__(self, "module", None)  # frozen dataclass: the one field that changes, once


def current() -> Group:
    """The data-parallel group of this process: torch.distributed's, when it is initialised."""
    if dist.is_available() and dist.is_initialized():
        return Group(rank=dist.get_rank(), world_size=dist.get_world_size())
    return Group()


def finish(*groups: Group) -> None:
    """End this process's part in a data-parallel run: close every :class:`Engine` among ``groups``
    (:meth:`Engine.close`), collect the garbage (a wrapper caught in a reference cycle is freed only
    by the collector, which could otherwise run after the group is gone), then destroy the process
    group. In that order, or the run can hang on its way out; nothing to do in a single process.
    Every process calls it, and nothing may use the engines after."""
    for group in groups:
        if isinstance(group, Engine):
            group.close()
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


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


# ---------------------------------------------------------------------- engines
def _sum_hook(process_group, bucket):
    """DDP communication hook: the bucket's gradients summed over processes (DDP's default divides
    the sum by the number of processes; each process's loss is already its part of the global loss)."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _ddp(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
    """``DistributedDataParallel`` around ``model`` (which stays what sampling and checkpoints use).
    Buffers are not synchronised in forward: sampling runs a different number of forwards on each
    process, and a collective in each would stall them."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, forward_sync_buffers=False)
    ddp.register_comm_hook(None, _sum_hook)
    return ddp


def _fsdp(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
    """``fully_shard`` (FSDP2) on each decoder layer (the model's ``_no_split_modules``, as
    ``accelerate`` picks them) and on the whole model, in place; gradients summed, not averaged.
    ``optimizer`` is pointed at the sharded parameters, its state (if any) sharded alike."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    layers = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in layers]
    if not units:
        raise ValueError(f"parallel='fsdp' shards a model by its decoder layers, but {type(model).__name__} names "
                         f"none (_no_split_modules = {sorted(layers)}); use parallel='ddp'")
    names = optimizer_parameter_names(model, optimizer)
    state = optimizer.state_dict()
    for unit in units:
        fully_shard(unit, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    for unit in fsdp_units(model):  # per unit: these settings do not recurse
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    params = dict(model.named_parameters())
    flat = iter(names)
    for group in optimizer.param_groups:
        group["params"] = [params[next(flat)] for _ in group["params"]]
    optimizer.state.clear()
    if state["state"]:  # a resumed run: the full state, sharded like the parameters
        set_optimizer_state_dict(model, optimizer, optimizer_state_by_name(state, names),
                                 options=StateDictOptions(full_state_dict=True))
    return model


#: the engines by name: each takes ``(model, optimizer)`` and returns the module the training passes run
PARALLEL = {"ddp": _ddp, "fsdp": _fsdp}


def engage(model: torch.nn.Module, optimizer: torch.optim.Optimizer, parallel: str) -> Group:
    """Hand this process's ``model`` to the engine ``parallel`` (a key of ``PARALLEL``) and return
    the :class:`Engine` the trainer then uses as its group; a single process stays a plain
    :class:`Group`. Call it after the optimiser exists (and after a checkpoint was loaded into the
    plain model): FSDP moves the optimiser onto the shards."""
    if parallel not in PARALLEL:
        raise ValueError(f"unknown parallel strategy {parallel!r}; choose one of {sorted(PARALLEL)}")
    group = current()
    if group.world_size == 1:
        return group
    return Engine(group.rank, group.world_size, parallel, PARALLEL[parallel](model, optimizer))


def fsdp_units(model: torch.nn.Module) -> list:
    """The modules of ``model`` that ``fully_shard`` made units of (empty for any other model)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def optimizer_parameter_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimiser's parameters, in the order of its state dict's indices."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def optimizer_state_by_name(state: dict, names: list[str]) -> dict:
    """An optimiser state dict keyed by index (``optimizer.state_dict()``) keyed by parameter name
    instead (the form of ``torch.distributed.checkpoint``'s full state dicts)."""
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}


def optimizer_state_by_index(state: dict, names: list[str]) -> dict:
    """The inverse of :func:`optimizer_state_by_name`: what a one-process run's optimiser saves."""
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in state["param_groups"]]}


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``(trainable weights, optimiser state)`` of a sharded model, whole, on every process (a
    collective: every process calls it). The optimiser's state is keyed by index, as a one-process
    run saves it, so checkpoints do not depend on the engine."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict

    names = optimizer_parameter_names(model, optimizer)
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True))
    optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return weights, optimizer_state_by_index(optim, names)
