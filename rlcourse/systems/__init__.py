"""A discrete-event simulator of multiplexed RL pipelines, and the schedulers of the JigsawRL chapter.

An RL iteration of one pipeline (one fine-tuning job) is four stages: **rollout** (decode the
responses), **reward** (score them), **reference** (log-probs under the frozen reference) and
**training** (the update). The simulator cuts every stage into *sub-stages*, one per worker (a GPU
group), so that a stage on ``M`` workers is ``M`` tasks. A schedule assigns each task a worker and
a start time, respecting the task graph (precedence) and one task at a time per worker.

Four schedulers share the same inputs (the rollout lengths) and the same cost model:

==========  ==================================================================================
stage       verl-like: one stage at a time on all workers, pipelines take turns (a barrier
            after every stage); the makespan is the sum over stages of the slowest sub-stage.
multiplex   the sub-stage graph of all pipelines, greedy list scheduling with critical-path
            priority: an idle worker takes any ready sub-stage of any pipeline.
migrate     multiplex, plus long-tail migration: when a rollout shard has fewer than ``tau``
            sequences left, its tail is moved (re-prefilled) onto one worker with the other
            shards' tails, when that saves more worker-time than it costs.
lookahead   a fortified rollout (look-ahead) over the ``migrate`` graph with exact durations,
            and the stage-level plan as a fallback; never worse than either (see the chapter).
==========  ==================================================================================

The costs are :class:`StageCosts`: synthetic by default, or measured on rlcourse's own RL loop by
:func:`measure_stage_costs` (decode steps of :func:`rlcourse.lm.sample`, the per-token stage times
that :class:`rlcourse.train.Trainer` logs, a prefill for migration), in units of one decode step.

The model is a teaching reconstruction, not JigsawRL's own formulation (see the chapter).

The package is split along the simulator's seams; every module but :mod:`.measure` uses NumPy only,
and :mod:`.measure` imports torch inside the functions that time the model, so importing the
simulator never loads torch:

=============  ==========================================================================
``costs``      :class:`StageCosts`, rollout lengths, decode time, idle fractions, migration
``graph``      :class:`TaskGraph` and :func:`build_graph`
``scheduler``  bottom levels, :func:`list_schedule`, :func:`lookahead_schedule`
``simulator``  :func:`simulate` and :func:`stage_rollout_share`
``measure``    stage costs measured on rlcourse's own loop (the LM)
=============  ==========================================================================

The chapter's experiment (the sweeps over the tail weight, on the study runner) and the paper's
claims are :mod:`rlcourse.studies.jigsawrl`.
"""
from __future__ import annotations

from .costs import (STAGES, StageCosts, decode_time, exponential_idle_fraction, fit_decode_cost,
                    migration_saving, resample_lengths, sample_lengths, split_tail, sync_idle_fraction,
                    tail_weight)
from .graph import TaskGraph, build_graph
from .measure import (MEASURED_STAGES, measure_stage_costs, stage_costs_from_seconds, time_decode_steps, time_prefill,
                      time_trainer_stages)
from .scheduler import Schedule, bottom_levels, list_schedule, lookahead_schedule
from .simulator import SCHEDULERS, SimResult, simulate, stage_rollout_share

__all__ = [
    "STAGES", "StageCosts", "decode_time", "exponential_idle_fraction", "fit_decode_cost", "migration_saving",
    "resample_lengths", "sample_lengths", "split_tail", "sync_idle_fraction", "tail_weight",
    "TaskGraph", "build_graph",
    "MEASURED_STAGES", "measure_stage_costs", "stage_costs_from_seconds",
    "time_decode_steps", "time_prefill", "time_trainer_stages",
    "Schedule", "bottom_levels", "list_schedule", "lookahead_schedule",
    "SCHEDULERS", "SimResult", "simulate", "stage_rollout_share",
]
