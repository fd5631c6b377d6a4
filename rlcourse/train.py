"""One trainer for the loop: sample -> score -> advantages -> loss -> update.

::

    prompts --sample--> rollouts --score--> rewards --estimate--> advantages --loss--> update
      ^ prompt_sampler    ^ sampler           ^ reward              ^ advantage_estimator  ^ policy_loss

Each of the five parts is looked up by name in its registry (:mod:`rlcourse.data`,
:mod:`rlcourse.rollout`, :mod:`rlcourse.rewards`, :mod:`rlcourse.advantages`,
:mod:`rlcourse.losses`), so a chapter that changes one part registers a function and names it in the
config; the trainer is never edited. The configuration speaks TRL's vocabulary
(``num_generations``, ``beta``, ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``,
``max_completion_length``, ``num_iterations``).

Also here: :func:`sft` (supervised fine-tuning on demonstrations) and :func:`train_reward_model`
(Bradley-Terry on preference pairs).
"""
from __future__ import annotations

import copy
import csv
import functools
import inspect
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tqdm import tqdm

from . import distributed
from .advantages import get_estimator, place_on_last_token
from .data import get_prompt_sampler
from .lm.heads import ScalarHeadModel
from .lm.engine import lean_engine_supports
from .lm.model import response_logprobs, shared_prefix_logprobs
from .lm.sampling import RolloutBatch, encode_prompts
from .lm.zoo import greedy_accuracy, sft_loss
from .losses import AGG_MODES, LOSS_TYPE_TO_AGG, agg_denominators, agg_loss, bradley_terry_loss, \
    compute_value_loss, get_policy_loss, kl_penalty
from .metrics import explained_variance
from .ops import check_finite, masked_mean, masked_whiten
from .rewards import get_reward
from .rollout import get_sampler
from .tasks import Example, Task, get_task


@dataclass
class RLConfig:
    """Configuration of :class:`Trainer`, in TRL's vocabulary where TRL has a name.

    ================================= ==========================================================
    num_generations                   G, samples per prompt (contiguous in the batch)
    prompts_per_step                  prompts per step; the batch has ``prompts_per_step * G`` rows (data-
                                      parallel: the whole step's, shared among the processes)
    beta                              KL coefficient; a reference model exists only when beta > 0
    kl_estimator                      ``k1``/``k2``/``k3``/``k3+`` (``kl_penalty``)
    kl_in_reward                      put ``-beta * k1`` in the per-token reward instead of the loss
    epsilon, epsilon_high             PPO clip range (``epsilon_high`` defaults to ``epsilon``)
    loss_type                         ``dapo``/``bnpo``/``grpo``/``dr_grpo`` or a verl aggregation mode;
                                      with micro-batches, ``bnpo`` is the mean of their local token-means
    scale_rewards                     ``group``/``batch``/``none`` (``grpo`` estimator only)
    max_completion_length             new tokens per response (also Dr. GRPO's constant)
    num_iterations                    optimisation passes over each batch (mu)
    micro_batch_size                  rows per backward pass (gradient identical to one pass)
    skip_zero_advantage_rows          no forward/backward for rows whose gradient is exactly zero
    share_prompt_forward              the update runs each prompt once for its G samples (same result)
    advantage_estimator, policy_loss, reward, sampler, prompt_sampler: registry names
    advantage_kwargs, sampler_kwargs, loss_kwargs, reward_kwargs: extra keywords for that part (each
                                      must be a parameter the part names, else ValueError)
    ================================= ==========================================================
    """

    # TRL vocabulary
    num_generations: int = 8
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    max_completion_length: int = 16
    num_iterations: int = 1
    learning_rate: float = 1e-4
    lr_scheduler: str = "constant"  # or "linear": decay to 0 at `steps` (the HF Trainer default)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # the loop
    steps: int = 100
    prompts_per_step: int = 16
    micro_batch_size: int | None = None
    skip_zero_advantage_rows: bool = True  # leave rows of exactly zero gradient out of the update
    share_prompt_forward: bool = True  # run each prompt once in the update, not once per sample
    max_grad_norm: float | None = 1.0
    entropy_coef: float = 0.0
    clip_ratio_c: float | None = None
    kl_estimator: str = "k3+"  # k3's value (logged), k2's gradient: the gradient of KL(pi || ref)
    kl_in_reward: bool = False
    seed: int = 0
    train_pool_size: int = 4000
    # the swappable parts
    prompt_sampler: str | Callable = "uniform"
    sampler: str | Callable = "policy"
    reward: str | Callable = "task"
    advantage_estimator: str | Callable = "grpo"
    policy_loss: str | Callable = "vanilla"
    advantage_kwargs: dict = field(default_factory=dict)  # extra keywords for the estimator
    sampler_kwargs: dict = field(default_factory=dict)  # ... for the sampler (e.g. a replay ratio)
    loss_kwargs: dict = field(default_factory=dict)  # ... for the policy loss
    reward_kwargs: dict = field(default_factory=dict)  # ... for the reward (e.g. a bonus's weight)
    # PPO with a critic
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.5
    cliprange_value: float | None = 0.2
    critic_learning_rate: float | None = None
    whiten_advantages: bool | None = None  # default: True for gae, False otherwise
    # evaluation, logging, checkpoints
    eval_every: int = 0
    eval_prompts: int = 128
    output_dir: str | None = None
    save_every: int = 0
    progress: bool = True

    def __post_init__(self):
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {self.num_generations}")
        if self.prompts_per_step < 1 or self.steps < 0:
            raise ValueError("prompts_per_step must be >= 1 and steps >= 0")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {self.num_iterations}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {self.scale_rewards!r}")
        if self.loss_type not in LOSS_TYPE_TO_AGG and self.loss_type not in AGG_MODES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; TRL names {sorted(LOSS_TYPE_TO_AGG)} "
                             f"or verl modes {AGG_MODES}")
        if self.lr_scheduler not in ("constant", "linear"):
            raise ValueError(f"lr_scheduler must be 'constant' or 'linear', got {self.lr_scheduler!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")

    @property
    def loss_agg_mode(self) -> str:
        return LOSS_TYPE_TO_AGG.get(self.loss_type, self.loss_type)

    def to_dict(self) -> dict:
        return {k: (v if not callable(v) else getattr(v, "__name__", repr(v))) for k, v in asdict(self).items()}


def call_with_supported(fn: Callable, **available):
    """Call ``fn`` with the keyword arguments its signature accepts (all of them if it takes ``**kw``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in params})


REWARD_CONTEXT = ("model", "tokenizer", "ref_model", "step")


def bind_reward(fn: Callable, reward_kwargs: dict, **context) -> Callable:
    """The loop's reward as ``fn(batch, examples, task, state)``, with the context the reward names.

    A reward that declares a parameter called ``model``, ``tokenizer``, ``ref_model`` (None when the
    KL term is off) or ``step`` receives the loop's current one (a self-reward scores with the policy,
    a scheduled bonus reads the step); ``reward_kwargs`` from the config reach it too. A reward that
    names none of them is returned unchanged, so samplers that call the reward themselves see the same
    function the loop scores with."""
    params = inspect.signature(fn).parameters
    extra = {key: v for key, v in context.items() if key in params}
    extra.update(reward_kwargs)
    return functools.partial(fn, **extra) if extra else fn


# the arguments the loop passes to every sampler (a sampler takes those it names)
SAMPLER_ARGUMENTS = ("model", "tokenizer", "prompts", "config", "generator", "state", "examples", "pool", "task",
                     "reward", "step")


def call_sampler(fn: Callable, loop: dict, kwargs: dict, what: str = "sampler_kwargs"):
    """Call a sampler as the loop does: the loop's arguments ``loop`` that ``fn`` names, plus the
    configured ``kwargs``. A key of ``kwargs`` that the loop gives, or one that ``fn`` does not take,
    is a ValueError naming ``what`` (a wrapper sampler passes its ``base_kwargs`` through here)."""
    given = sorted(set(kwargs) & set(SAMPLER_ARGUMENTS))
    if given:
        raise ValueError(f"{what} {given} are given by the loop")
    check_accepts(fn, kwargs, what)
    return call_with_supported(fn, **loop, **kwargs)


def call_policy_loss(loss: Callable, agg: dict, **named):
    """Call a policy loss with the arguments its signature names. The aggregation keywords in ``agg``
    (``loss_agg_mode``, ``global_tokens``, ``global_seqs``, ``max_len``) also reach a ``**kwargs``
    parameter, which is how a loss forwards them to :func:`~rlcourse.losses.agg_loss`; the clip
    arguments reach only a loss that names them (``pg`` has no clip range)."""
    params = inspect.signature(loss).parameters
    kwargs = {key: v for key, v in {**named, **agg}.items() if key in params}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs.update(agg)
    return loss(**kwargs)


def check_accepts(fn: Callable, kwargs: dict, what: str) -> None:
    """Raise a ValueError naming the keywords of ``kwargs`` that ``fn`` does not take (a misspelt
    knob in a config must not be dropped in silence)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        name = getattr(fn, "__name__", repr(fn))
        raise ValueError(f"{what} {unknown} are not parameters of {name}; it takes {sorted(params)}")


def needs_values(estimator: Callable) -> bool:
    return "values" in inspect.signature(estimator).parameters


def is_peft_model(model) -> bool:
    """True for a ``peft`` model with adapters (it can switch them off with ``disable_adapter()``)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class AdapterOffReference:
    """The reference policy of a LoRA run: the policy's own base weights with the adapter switched off
    (``peft``'s ``disable_adapter()`` context), so no second copy of the weights exists, as in TRL.
    Callable like the model; ``eval()`` and ``requires_grad_()`` leave the policy untouched."""

    def __init__(self, model):
        if not is_peft_model(model):
            raise ValueError(f"AdapterOffReference needs a peft model with an adapter, not {type(model).__name__}")
        self.model = model

    def __call__(self, *args, **kwargs):
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    @property
    def config(self):
        return self.model.config

    def eval(self):
        return self

    def requires_grad_(self, requires_grad: bool = True):
        return self


class Trainer:
    """The RL loop on a causal LM and a verifiable task.

    ``trainer = Trainer(model, tokenizer, "addition", RLConfig(...)); trainer.train()``. Each step's
    metrics are appended to ``trainer.history`` (and to ``metrics.csv`` / ``metrics.jsonl`` in
    ``output_dir``). With ``output_dir`` and ``save_every``, checkpoints are written there, and
    ``Trainer(..., resume=True)`` continues from the last one exactly (the same weights at step n
    as an uninterrupted run).

    Besides the learning metrics, each step logs the wall-clock seconds of its stages
    (``time_rollout``, ``time_reward``, ``time_reference``, ``time_update``, and ``step_seconds`` in
    all) and the tokens it processed (``prompt_tokens``, ``response_tokens``), which is what a model
    of the RL system's throughput (:mod:`rlcourse.systems`) needs as input, and
    ``frac_rows_trained``, the share of rows that went through the update (rows of exactly zero
    gradient are skipped; see :meth:`skips_zero_advantage_rows`).
    """

    def __init__(self, model, tokenizer, task: Task | str, config: RLConfig | None = None, *,
                 ref_model=None, value_model: ScalarHeadModel | None = None,
                 train_examples: Sequence[Example] | None = None, eval_examples: Sequence[Example] | None = None,
                 resume: bool = False):
        self.config = cfg = config or RLConfig()
        self.model, self.tokenizer, self.task = model, tokenizer, get_task(task)
        self.prompt_sampler = get_prompt_sampler(cfg.prompt_sampler)
        self.sampler = get_sampler(cfg.sampler)
        self.reward_fn = get_reward(cfg.reward)
        self.estimator = get_estimator(cfg.advantage_estimator)
        self.policy_loss = get_policy_loss(cfg.policy_loss)
        # data parallelism (rlcourse.distributed): one process of several when launched so
        self.dp = distributed.current()
        if self.dp.world_size > 1:
            self.dp.share(cfg.prompts_per_step)  # more processes than prompts: a clear error now
            if cfg.scale_rewards == "batch" or cfg.whiten_advantages:
                raise ValueError("scale_rewards='batch' and whiten_advantages use statistics of the whole batch, "
                                 "which a data-parallel process does not hold; use them in a single process")
        if set(cfg.sampler_kwargs) & set(SAMPLER_ARGUMENTS):
            raise ValueError(f"sampler_kwargs {sorted(set(cfg.sampler_kwargs) & set(SAMPLER_ARGUMENTS))} are given "
                             "by the loop")
        check_accepts(self.sampler, cfg.sampler_kwargs, "sampler_kwargs")
        check_accepts(self.estimator, cfg.advantage_kwargs, "advantage_kwargs")
        check_accepts(self.policy_loss, cfg.loss_kwargs, "loss_kwargs")
        if set(cfg.reward_kwargs) & set(REWARD_CONTEXT):
            raise ValueError(f"reward_kwargs {sorted(set(cfg.reward_kwargs) & set(REWARD_CONTEXT))} are given by the loop")
        check_accepts(self.reward_fn, cfg.reward_kwargs, "reward_kwargs")
        self.train_pool = list(train_examples) if train_examples is not None else \
            self.task.examples(cfg.train_pool_size, seed=cfg.seed, split="train")
        self.eval_examples = list(eval_examples) if eval_examples is not None else \
            self.task.examples(cfg.eval_prompts, seed=cfg.seed, split="test")
        # a frozen reference model only when the KL term is on
        self.ref_model = None
        if cfg.beta > 0:
            if ref_model is None and is_peft_model(model):  # LoRA: the base with the adapter off
                ref_model = AdapterOffReference(model)
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(model)).eval()
            self.ref_model.requires_grad_(False)
        # a critic only when the estimator reads values
        self.value_model = value_model
        if needs_values(self.estimator) and self.value_model is None:
            self.value_model = ScalarHeadModel.from_policy(model)
        # fused AdamW (one kernel for all parameters), as transformers' Trainer does by default
        # only trainable parameters (with LoRA: the adapter's; the frozen base has no optimiser state)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                           weight_decay=0.0, fused=True)
        decay = (lambda step: max(0.0, 1.0 - step / max(1, cfg.steps))) if cfg.lr_scheduler == "linear" \
            else (lambda step: 1.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, decay)
        self.critic_optimizer = None
        if self.value_model is not None:
            self.critic_optimizer = torch.optim.AdamW(self.value_model.parameters(), weight_decay=0.0, fused=True,
                                                      lr=cfg.critic_learning_rate or cfg.learning_rate)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.state: dict = {}  # memory of stateful parts (prompt samplers, estimators, rewards)
        self.step_count = 0
        self.history: list[dict] = []
        self.output_dir = Path(cfg.output_dir) if cfg.output_dir else None
        if resume:
            last = self.latest_checkpoint()
            if last is not None:
                self.load_checkpoint(last)

    # ------------------------------------------------------------------ one step
    def step(self) -> dict:
        """Run one step of the loop and return its metrics."""
        cfg, k = self.config, self.step_count + 1
        t0 = time.perf_counter()
        examples = call_with_supported(self.prompt_sampler, pool=self.train_pool, n=cfg.prompts_per_step,
                                       generator=self.generator, state=self.state, task=self.task, step=k)
        generator = self.generator
        if self.dp.world_size > 1:
            # every process drew the same global prompts (the generator is seeded alike and serves the
            # prompt sampler alone); each keeps its share and samples with a generator of its own
            examples = examples[self.dp.share(len(examples))]
            generator = torch.Generator().manual_seed(distributed_seed(cfg.seed, self.dp.rank, k))
        reward = bind_reward(self.reward_fn, cfg.reward_kwargs, model=self.model, tokenizer=self.tokenizer,
                             ref_model=self.ref_model, step=k)
        batch: RolloutBatch = call_with_supported(
            self.sampler, model=self.model, tokenizer=self.tokenizer, prompts=[e.prompt for e in examples],
            config=cfg, generator=generator, state=self.state, examples=examples, pool=self.train_pool,
            task=self.task, reward=reward, step=k, **cfg.sampler_kwargs)
        t_rollout = time.perf_counter()
        # a sampler that adds rows beyond the step's prompts (replayed or cached ones) names their examples
        per_row = batch.examples if batch.examples is not None else [examples[int(i)] for i in batch.index]
        # a sampler that already scored its rows with the loop's reward (e.g. S-GRPO's injection) hands
        # the scores over, so the reward the advantages see is the one the sampler acted on
        scores = batch.scores if batch.scores is not None else reward(batch, per_row, self.task, self.state)
        scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1).to(batch.response_mask.device)
        if scores.shape[0] != len(batch):
            raise ValueError(f"step {k}: the reward returned {scores.shape[0]} scores for {len(batch)} rows")
        self._check(k, "rewards", scores)
        t_reward = time.perf_counter()

        mask = batch.response_mask
        old_logprobs = batch.logprobs
        with torch.no_grad():
            ref_logprobs = None if self.ref_model is None else response_logprobs(
                self.ref_model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
            t_reference = time.perf_counter()
            values = None if self.value_model is None else self.value_model.response_values(
                batch.input_ids, batch.attention_mask, batch.response_len) * mask
        token_level_rewards = place_on_last_token(scores, mask)
        if cfg.kl_in_reward and ref_logprobs is not None:
            token_level_rewards = token_level_rewards - cfg.beta * kl_penalty(old_logprobs, ref_logprobs, "k1") * mask
        offered = dict(token_level_rewards=token_level_rewards, response_mask=mask, index=batch.index,
                       values=values, gamma=cfg.gamma, lam=cfg.lam, norm_adv_by_std_in_grpo=cfg.scale_rewards == "group",
                       batch=batch, examples=per_row, scores=scores, state=self.state, step=k, model=self.model)
        clash = sorted(set(batch.extras) & (set(offered) | LOSS_ARGUMENTS | set(cfg.loss_kwargs)))
        if clash:
            raise ValueError(f"the sampler's batch.extras {clash} shadow arguments the loop passes to estimators "
                             "or policy losses")
        advantages, returns = call_with_supported(self.estimator, **offered, **batch.extras, **cfg.advantage_kwargs)
        if cfg.scale_rewards == "batch" and cfg.advantage_estimator == "grpo":
            advantages = advantages / (advantages[:, 0].std() + 1e-6) * mask  # PPO-Lite: batch std
        whiten = cfg.whiten_advantages if cfg.whiten_advantages is not None else values is not None
        if whiten:
            advantages = masked_whiten(advantages, mask) * mask
        self._check(k, "advantages", advantages)

        t_update = time.perf_counter()
        metrics = self._update(k, batch, old_logprobs, ref_logprobs, advantages, returns, values)
        t_end = time.perf_counter()
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step_count = k
        groups = scores.reshape(-1, cfg.num_generations) if len(scores) % cfg.num_generations == 0 else None
        metrics.update({
            "step": k,
            "reward": float(scores.mean()),
            "reward_std": float(scores.std()) if len(scores) > 1 else 0.0,
            "frac_zero_std_groups": float((groups.std(1) == 0).float().mean()) if groups is not None else float("nan"),
            "response_length": float(batch.lengths.float().mean()),
            "truncated": float(batch.truncated.float().mean()),
            "advantage_std": float(advantages[mask == 1].std()) if mask.sum() > 1 else 0.0,
            # wall-clock seconds per stage (values and advantages fall between reference and update)
            "time_rollout": t_rollout - t0,
            "time_reward": t_reward - t_rollout,
            "time_reference": t_reference - t_reward,
            "time_update": t_end - t_update,
            "sample_seconds": t_reward - t0,
            "step_seconds": t_end - t0,
            "response_tokens": int(mask.sum()),
            "prompt_tokens": int(batch.prompt_mask.sum()),
        })
        if values is not None:
            metrics["explained_variance"] = explained_variance(values, returns, mask)
        clash = sorted(set(batch.metrics) & set(metrics))
        if clash:
            raise ValueError(f"the sampler's batch.metrics {clash} shadow metrics the loop logs")
        metrics.update({key: float(v) for key, v in batch.metrics.items()})
        if cfg.eval_every and (k % cfg.eval_every == 0 or k == cfg.steps):
            metrics["eval_greedy_accuracy"] = self.evaluate()
        # data-parallel: per-row metrics averaged over processes; parts of the global loss summed
        metrics = self.dp.reduce_metrics(metrics, summed=GLOBAL_SUM_METRICS, keep={"step", "learning_rate"})
        self.history.append(metrics)
        self._log(metrics)
        if self.output_dir is not None and cfg.save_every and k % cfg.save_every == 0:
            self.save_checkpoint()
        return metrics

    def _update(self, k, batch, old_logprobs, ref_logprobs, advantages, returns, values) -> dict:
        cfg, mask = self.config, batch.response_mask
        B = len(batch)
        mb = cfg.micro_batch_size or B
        # bnpo normalises each micro-batch by its own tokens (TRL's local batch); its loss is defined as
        # the mean over micro-batches of those local token-means (hence the 1/n_micro below). Every
        # other loss_type uses the whole batch's denominators, so micro-batching leaves it unchanged.
        denominators = agg_denominators(mask) if cfg.loss_type != "bnpo" else {}
        # data-parallel: the denominators of the whole step, over every process (rlcourse.distributed)
        denominators = {key: self.dp.sum(v) for key, v in denominators.items()}
        agg = dict(loss_agg_mode=cfg.loss_agg_mode, **denominators)
        if cfg.loss_agg_mode == "seq-mean-token-sum-norm":
            agg["max_len"] = cfg.max_completion_length
            agg.setdefault("global_seqs", self.dp.sum(float(B)))
        input_ids, attention_mask, T = batch.input_ids, batch.attention_mask, batch.response_len
        sums: dict[str, float] = {"loss": 0.0}
        # Rows whose gradient is exactly zero need no forward or backward pass (see skips_zero_advantage_rows);
        # the denominators above stay those of the whole batch, so the gradient is unchanged.
        live = torch.arange(B, device=advantages.device)
        if self.skips_zero_advantage_rows(values):
            live = (advantages != 0).any(-1).nonzero().squeeze(-1)
        # the entropy metric of the whole batch, from the sampler when it recorded one (equal to the
        # training-time entropy on the first pass, whose weights are the sampling weights)
        sampled_entropy = batch.entropy is not None and cfg.num_iterations == 1
        need_entropy = bool(cfg.entropy_coef) or not sampled_entropy
        # Columns that are padding in every row to be trained (left of the longest prompt, right of the
        # longest response) are dropped: padding enters no masked-in term, so nothing changes but the cost.
        P = batch.prompt_ids.shape[1]
        if len(live):
            keep_p = int(batch.prompt_mask[live].sum(-1).max())
            T = max(1, int(batch.response_attention[live].sum(-1).max()))
            input_ids, attention_mask = input_ids[:, P - keep_p:P + T], attention_mask[:, P - keep_p:P + T]
        prompt_len = input_ids.shape[1] - T
        mask, old_logprobs, advantages = mask[:, :T], old_logprobs[:, :T], advantages[:, :T]
        ref_logprobs, returns, values = (None if x is None else x[:, :T] for x in (ref_logprobs, returns, values))
        # per-token extras of the sampler reach a policy loss that names them (e.g. a replay sampler's
        # importance weights, a multi-turn sampler's turn index); a loss that does not name one never sees it
        extras = {key: v[:, :T] for key, v in batch.extras.items()
                  if key in inspect.signature(self.policy_loss).parameters}
        n_micro = self.dp.sum(-(-len(live) // mb)) if cfg.loss_type == "bnpo" else 1  # see above (all processes)
        self.model.train()
        for _ in range(cfg.num_iterations):
            for start in range(0, len(live), mb):
                rows = live[start:start + mb]
                logp = self._policy_logprobs(input_ids, attention_mask, prompt_len, batch.index, rows,
                                             batch.temperature, need_entropy)
                if need_entropy:
                    logp, entropy = logp
                pg_loss, pg_metrics = call_policy_loss(
                    self.policy_loss, agg, old_log_prob=old_logprobs[rows], log_prob=logp, advantages=advantages[rows],
                    response_mask=mask[rows], clip_ratio_low=cfg.epsilon,
                    clip_ratio_high=cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon,
                    clip_ratio_c=cfg.clip_ratio_c, **{key: v[rows] for key, v in extras.items()}, **cfg.loss_kwargs)
                self._check(k, "policy loss", pg_loss)
                loss = pg_loss
                if ref_logprobs is not None and not cfg.kl_in_reward:
                    kl = agg_loss(kl_penalty(logp, ref_logprobs[rows], cfg.kl_estimator), mask[rows], **_agg_only(agg))
                    self._check(k, "KL penalty", kl)
                    loss = loss + cfg.beta * kl
                    sums["kl"] = sums.get("kl", 0.0) + kl.item() / n_micro
                if need_entropy:
                    ent = agg_loss(entropy, mask[rows], **_agg_only(agg))
                    sums["entropy"] = sums.get("entropy", 0.0) + ent.item() / n_micro
                    if cfg.entropy_coef:
                        loss = loss - cfg.entropy_coef * ent
                (loss / n_micro).backward()
                share = len(rows) / len(live)  # metrics average over the rows trained
                for name, value in pg_metrics.items():
                    sums[name] = sums.get(name, 0.0) + value * share
                sums["loss"] = sums.get("loss", 0.0) + loss.item() / n_micro
                if self.value_model is not None:
                    vpreds = self.value_model.response_values(input_ids[rows], attention_mask[rows], T)
                    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns[rows], values[rows], mask[rows],
                                                              cfg.cliprange_value, **agg)
                    self._check(k, "value loss", vf_loss)
                    (cfg.vf_coef * vf_loss / n_micro).backward()
                    sums["vf_loss"] = sums.get("vf_loss", 0.0) + vf_loss.item() / n_micro
                    sums["vf_clipfrac"] = sums.get("vf_clipfrac", 0.0) + vf_clipfrac * share
            if len(live) == 0:  # every row skipped: the gradient is zero, and AdamW still steps its moments
                for p in self.model.parameters():
                    if p.requires_grad and p.grad is None:
                        p.grad = torch.zeros_like(p)
            self.dp.sum_gradients(self.model.parameters())  # the gradient of the global loss, on every replica
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm or float("inf"))
            self._check(k, "gradient norm", grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.value_model is not None:
                self.dp.sum_gradients(self.value_model.parameters())
                torch.nn.utils.clip_grad_norm_(self.value_model.parameters(), cfg.max_grad_norm or float("inf"))
                self.critic_optimizer.step()
                self.critic_optimizer.zero_grad(set_to_none=True)
            sums["grad_norm"] = float(grad_norm)
        self.model.eval()
        n = cfg.num_iterations
        out = {key: (v / n if key != "grad_norm" else v) for key, v in sums.items()}
        if sampled_entropy:  # with the step's global denominators (bnpo has none: take them here)
            whole = {key: self.dp.sum(v) for key, v in agg_denominators(batch.response_mask).items()}
            out["entropy"] = float(agg_loss(batch.entropy, batch.response_mask, **{**whole, **_agg_only(agg)}))
        out["frac_rows_trained"] = len(live) / B
        return out

    def _policy_logprobs(self, input_ids, attention_mask, prompt_len: int, index, rows, temperature: float,
                         entropy: bool):
        """The policy's log-probs (and entropies) of ``rows``, with gradient. When the rows of a group
        share their prompt, each prompt goes through the model once (:func:`shared_prefix_logprobs`)."""
        T = input_ids.shape[1] - prompt_len
        if self.config.share_prompt_forward and lean_engine_supports(self.model):
            groups, inverse = torch.unique(index[rows], return_inverse=True)
            first = rows.new_empty(len(groups))
            first[inverse] = rows  # any row of each group: their prompts are checked equal below
            prompts, prompt_mask = input_ids[first, :prompt_len], attention_mask[first, :prompt_len]
            if torch.equal(prompts[inverse], input_ids[rows, :prompt_len]) and \
                    torch.equal(prompt_mask[inverse], attention_mask[rows, :prompt_len]):
                return shared_prefix_logprobs(self.model, prompts, prompt_mask, inverse, input_ids[rows, prompt_len:],
                                              temperature, return_entropy=entropy)
        return response_logprobs(self.model, input_ids[rows], attention_mask[rows], T, temperature,
                                 return_entropy=entropy)

    def skips_zero_advantage_rows(self, values=None) -> bool:
        """Whether rows whose advantages are all zero can be left out of the update.

        A row with zero advantages contributes exactly zero gradient when the only term of the loss
        is a policy loss that vanishes with the advantage (``vanilla`` PPO-clip and ``pg`` declare
        it with ``zero_at_zero_advantage``), no KL term is in the loss, no entropy bonus, and no
        critic trains on the row; the aggregation's denominators come from the whole batch (every
        ``loss_type`` except ``bnpo``). Groups whose samples all got the same reward are such rows,
        a third of the batch or more once a policy is good. ``RLConfig(skip_zero_advantage_rows=False)``
        turns this off.
        """
        cfg = self.config
        return (cfg.skip_zero_advantage_rows and getattr(self.policy_loss, "zero_at_zero_advantage", False)
                and (self.ref_model is None or cfg.kl_in_reward) and not cfg.entropy_coef
                and values is None and self.value_model is None and cfg.loss_type != "bnpo")

    @staticmethod
    def _check(step: int, name: str, x: torch.Tensor) -> None:
        try:
            check_finite(name, torch.as_tensor(x))
        except FloatingPointError as err:
            raise FloatingPointError(f"step {step}: {err}; stopping before the update corrupts the model") from None

    # ------------------------------------------------------------------ loop, eval, logging
    def train(self, steps: int | None = None) -> list[dict]:
        """Run until ``steps`` (default ``config.steps``) steps are done in total; returns the history."""
        total = self.config.steps if steps is None else steps
        bar = tqdm(total=total, initial=self.step_count, desc="RL", disable=not self.config.progress,
                   mininterval=1.0)
        while self.step_count < total:
            m = self.step()
            bar.update(1)
            bar.set_postfix(reward=f"{m['reward']:.2f}", loss=f"{m['loss']:.3f}")
        bar.close()
        return self.history

    def evaluate(self, examples: Sequence[Example] | None = None) -> float:
        """Greedy accuracy of the current policy on held-out examples."""
        return greedy_accuracy(self.model, self.tokenizer, self.task, list(examples or self.eval_examples),
                               max_new_tokens=self.config.max_completion_length)

    def _log(self, metrics: dict) -> None:
        if self.output_dir is None or not self.dp.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        write_csv(self.history, self.output_dir / "metrics.csv")

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` atomically: weights (safetensors), optimiser, RNG states,
        the parts' state and the metrics history."""
        if self.output_dir is None:
            raise ValueError("save_checkpoint needs config.output_dir")
        final = self.output_dir / f"checkpoint-{self.step_count:06d}"
        if not self.dp.is_main:  # data-parallel: the replicas are equal; rank 0 writes
            self.dp.barrier()
            return final
        tmp = self.output_dir / f".tmp-checkpoint-{self.step_count:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if is_peft_model(self.model):  # LoRA: the adapter alone (a peft adapter folder), not the frozen base
            self.model.save_pretrained(str(tmp / "adapter"))
        else:
            save_model(self.model, str(tmp / "model.safetensors"))
        if self.value_model is not None:
            save_model(self.value_model, str(tmp / "value_model.safetensors"))
        torch.save({
            "step": self.step_count,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict() if self.critic_optimizer else None,
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
            "state": self.state,
            "history": self.history,
            "config": self.config.to_dict(),
        }, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.dp.barrier()
        return final

    def latest_checkpoint(self) -> Path | None:
        if self.output_dir is None or not self.output_dir.exists():
            return None
        found = sorted(self.output_dir.glob("checkpoint-*"))
        return found[-1] if found else None

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; the next step continues exactly.

        The weights load from safetensors (no code runs). ``trainer_state.pt`` is a pickle, because
        the parts' ``state`` may hold any Python data (a replay buffer, a bank of past weights), so
        it is read with ``weights_only=False``: resume only from checkpoints you wrote."""
        path = Path(path)
        if not (path / "trainer_state.pt").exists():
            raise FileNotFoundError(f"{path} is not a complete checkpoint (no trainer_state.pt)")
        if (path / "adapter").exists():
            load_adapter_weights(self.model, path / "adapter")
        else:
            load_model(self.model, str(path / "model.safetensors"))
        if self.value_model is not None:
            load_model(self.value_model, str(path / "value_model.safetensors"))
        st = torch.load(path / "trainer_state.pt", weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        if self.critic_optimizer is not None and st["critic_optimizer"] is not None:
            self.critic_optimizer.load_state_dict(st["critic_optimizer"])
        self.generator.set_state(st["generator"])
        torch.set_rng_state(st["torch_rng"])
        np.random.set_state(st["numpy_rng"])
        random.setstate(st["python_rng"])
        self.state, self.history, self.step_count = st["state"], st["history"], st["step"]
        if self.output_dir is not None and self.dp.is_main:  # rewrite the logs so they end at the checkpoint
            (self.output_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in self.history))
            write_csv(self.history, self.output_dir / "metrics.csv")


# the arguments the loop passes to every policy loss (an extra of the same name would shadow one)
LOSS_ARGUMENTS = {"old_log_prob", "log_prob", "advantages", "response_mask", "clip_ratio_low", "clip_ratio_high",
                  "clip_ratio_c", "loss_agg_mode", "global_tokens", "global_seqs", "max_len"}

# metrics that are each process's part of a global sum (their denominators are global) or counts
GLOBAL_SUM_METRICS = {"loss", "kl", "entropy", "vf_loss", "response_tokens", "prompt_tokens"}


def distributed_seed(seed: int, rank: int, step: int) -> int:
    """The sampling seed of process ``rank`` at ``step`` in a data-parallel run: a function of the
    three alone, so a resumed run samples what the uninterrupted one did."""
    return (seed * 1_000_003 + rank) * 1_000_033 + step


def load_adapter_weights(model, folder: str | Path) -> None:
    """Load the adapter that ``model.save_pretrained(folder)`` wrote back into the peft ``model``
    (exact: the same tensors); an adapter key the model lacks, or one of the model's adapter weights
    missing from the file, is a ValueError."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not is_peft_model(model):
        raise ValueError(f"{folder} holds a LoRA adapter, but the model ({type(model).__name__}) has none")
    result = set_peft_model_state_dict(model, load_file(str(Path(folder) / "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"adapter in {folder} does not fit the model: unexpected {result.unexpected_keys[:5]}, "
                         f"missing {missing[:5]}")


def _agg_only(agg: dict) -> dict:
    keys = ("loss_agg_mode", "global_tokens", "global_seqs", "max_len")
    return {("mode" if key == "loss_agg_mode" else key): v for key, v in agg.items() if key in keys}


def write_csv(history: list[dict], path: str | Path) -> None:
    keys: list[str] = []
    for row in history:
        keys += [key for key in row if key not in keys]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(history)


def load_metrics(path: str | Path) -> list[dict]:
    """Read ``metrics.jsonl`` (or a folder holding it) back into a list of dicts."""
    path = Path(path)
    path = path / "metrics.jsonl" if path.is_dir() else path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(history: list[dict] | str | Path, keys: Sequence[str], ax=None, label: str | None = None,
                 smooth: int = 1, **plot_kwargs):
    """Plot metrics against ``step`` (one line per key) and return the axes. ``smooth`` is the width of
    a trailing moving average; steps where a key is missing are skipped."""
    import matplotlib.pyplot as plt

    history = load_metrics(history) if isinstance(history, (str, Path)) else history
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for key in keys:
        pts = [(h["step"], h[key]) for h in history if key in h and h[key] is not None]
        if not pts:
            raise KeyError(f"metric {key!r} is not in the history; available: {sorted(history[0]) if history else []}")
        x, y = map(np.asarray, zip(*pts))
        if smooth > 1:
            y = np.array([y[max(0, i - smooth + 1):i + 1].mean() for i in range(len(y))])
        ax.plot(x, y, label=label if len(keys) == 1 and label else (f"{label}: {key}" if label else key), **plot_kwargs)
    ax.set_xlabel("step")
    return ax


# ---------------------------------------------------------------------- SFT and reward models
def sft(model, tokenizer, examples: Sequence[Example], steps: int, batch_size: int = 32, lr: float | None = None,
        seed: int = 0, progress: bool = False, optimizer: torch.optim.Optimizer | None = None) -> list[float]:
    """Supervised fine-tuning on demonstrations (``example.solution``); returns the loss per step.

    A fresh AdamW at ``lr`` (default ``1e-3``), or ``optimizer``: continue with it (and its Adam
    moments), so that a run split into several calls (to evaluate between them) is one run; its
    learning rate is then the optimizer's, and passing ``lr`` as well is an error.
    """
    if not examples:
        raise ValueError("sft needs at least one example")
    if optimizer is not None and lr is not None:
        raise ValueError(f"sft got both lr={lr} and an optimizer: the optimizer's learning rate is the one used; "
                         "pass one of the two")
    gen = torch.Generator().manual_seed(seed)
    opt = optimizer if optimizer is not None else torch.optim.AdamW(
        model.parameters(), lr=1e-3 if lr is None else lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc="SFT", disable=not progress):
        rows = torch.randint(len(examples), (min(batch_size, len(examples)),), generator=gen).tolist()
        loss = sft_loss(model, tokenizer, [examples[i] for i in rows])
        check_finite("SFT loss", loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


@dataclass(frozen=True)
class PreferencePair:
    """A prompt with a preferred (``chosen``) and a dispreferred (``rejected``) completion."""

    prompt: str
    chosen: str
    rejected: str


def encode_pairs(tokenizer, prompts: Sequence[str], completions: Sequence[str]):
    """Left-padded ``(ids, mask)`` of prompt + completion + EOS, for scoring with a reward model."""
    texts = [p + c + tokenizer.eos_token for p, c in zip(prompts, completions)]
    return encode_prompts(tokenizer, texts)


def reward_model_scores(reward_model: ScalarHeadModel, tokenizer, prompts: Sequence[str],
                        completions: Sequence[str]) -> torch.Tensor:
    """``(N,)`` reward-model scores of completions (with gradient if the caller enables it)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    ids, mask = encode_pairs(tokenizer, prompts, completions)
    return reward_model.sequence_reward(ids, mask)


def train_reward_model(reward_model: ScalarHeadModel, tokenizer, pairs: Sequence[PreferencePair], steps: int,
                       batch_size: int = 64, lr: float = 1e-3, seed: int = 0, progress: bool = False) -> list[dict]:
    """Fit a Bradley-Terry reward model on preference pairs; returns per-step loss and pair accuracy."""
    if not pairs:
        raise ValueError("train_reward_model needs at least one preference pair")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(reward_model.parameters(), lr=lr, weight_decay=0.0)
    log = []
    reward_model.train()
    for _ in tqdm(range(steps), desc="reward model", disable=not progress):
        rows = torch.randint(len(pairs), (min(batch_size, len(pairs)),), generator=gen).tolist()
        chunk = [pairs[i] for i in rows]
        prompts = [p.prompt for p in chunk]
        r_c = reward_model_scores(reward_model, tokenizer, prompts, [p.chosen for p in chunk])
        r_r = reward_model_scores(reward_model, tokenizer, prompts, [p.rejected for p in chunk])
        loss = bradley_terry_loss(r_c, r_r)
        check_finite("reward-model loss", loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append({"loss": loss.item(), "accuracy": float((r_c > r_r).float().mean())})
    reward_model.eval()
    return log
