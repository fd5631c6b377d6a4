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

The trainer's neighbours, each a module of its own and importable from here as before:
:mod:`rlcourse.parts` (how the loop calls a part with the arguments it names),
:mod:`rlcourse.checkpoints` (metrics logs and checkpoints), :mod:`rlcourse.lora` (a LoRA policy and its
adapter-off reference) and :mod:`rlcourse.supervised` (:func:`~rlcourse.supervised.sft` and
:func:`~rlcourse.supervised.train_reward_model`).
"""
from __future__ import annotations

import copy
import inspect
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from . import checkpoints, distributed
from .advantages import get_estimator, place_on_last_token
from .checkpoints import load_metrics, plot_metrics, write_csv  # noqa: F401  (public here too)
from .data import get_prompt_sampler
from .lm.engine import lean_engine_supports
from .lm.heads import ScalarHeadModel
from .lm.model import response_logprobs, shared_prefix_logprobs, shared_prefix_refusal
from .lm.sampling import RolloutBatch
from .lm.zoo import greedy_accuracy
from .lora import AdapterOffReference, is_peft_model, load_adapter_weights  # noqa: F401
from .losses import AGG_MODES, LOSS_TYPE_TO_AGG, agg_denominators, agg_loss, compute_value_loss, get_policy_loss, \
    kl_penalty
from .metrics import explained_variance
from .ops import check_finite, masked_whiten
from .parts import LOSS_ARGUMENTS, REWARD_CONTEXT, SAMPLER_ARGUMENTS, bind_reward, call_policy_loss, \
    call_sampler, call_with_supported, check_accepts, needs_values  # noqa: F401  (the loop's dispatch)
from .rewards import get_reward
from .rollout import get_sampler
from .supervised import PreferencePair, encode_pairs, reward_model_scores, sft, train_reward_model  # noqa: F401
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
    micro_batch_size                  rows per forward/backward pass (gradient identical to one pass)
    old_logprobs                      ``sampler``: the ratio's denominator is the sampler's log-probs;
                                      ``training``: the trainer's own (with one pass, its forward
                                      detached, as TRL does; else a forward before the first pass), so
                                      a sampler in another precision adds no noise to the ratio
    skip_zero_advantage_rows          no forward/backward for rows whose gradient is exactly zero
    share_prompt_forward              the update runs each prompt once for its G samples (same result up
                                      to rounding; not under gradient checkpointing)
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
    old_logprobs: str = "sampler"  # or "training" (see the table above)
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
        if self.old_logprobs not in ("sampler", "training"):
            raise ValueError(f"old_logprobs must be 'sampler' or 'training', got {self.old_logprobs!r}")

    @property
    def loss_agg_mode(self) -> str:
        return LOSS_TYPE_TO_AGG.get(self.loss_type, self.loss_type)

    def to_dict(self) -> dict:
        return {k: (v if not callable(v) else getattr(v, "__name__", repr(v))) for k, v in asdict(self).items()}


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
                self.ref_model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature,
                micro_batch_size=cfg.micro_batch_size)
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
        if cfg.old_logprobs == "training" and cfg.num_iterations > 1 and len(live):  # before any update
            with torch.no_grad():
                old_logprobs = response_logprobs(self.model, input_ids, attention_mask, T, batch.temperature,
                                                 micro_batch_size=mb) * mask
        n_passes = self.dp.start_update(-(-len(live) // mb))  # DDP/FSDP may need more (rlcourse.distributed)
        # transformers re-kernelizes a model at every train()/eval() switch (about 1 ms a step at the
        # benchmark's size, measured with cProfile); the lean engine's Llama has no dropout, so its
        # forward is the same in both modes and it skips the switch
        if not lean_engine_supports(self.model):
            self.model.train()
        for _ in range(cfg.num_iterations):
            for i, start in enumerate(range(0, len(live), mb)):
                self.dp.begin_pass(sync=i == n_passes - 1)
                rows = live[start:start + mb]
                logp = self._policy_logprobs(input_ids, attention_mask, prompt_len, batch.index, rows,
                                             batch.temperature, need_entropy)
                if need_entropy:
                    logp, entropy = logp
                pg_loss, pg_metrics = call_policy_loss(
                    self.policy_loss, agg, log_prob=logp, advantages=advantages[rows],
                    old_log_prob=logp.detach() if cfg.old_logprobs == "training" and cfg.num_iterations == 1
                    else old_logprobs[rows],
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
                (loss / n_micro if n_micro != 1 else loss).backward()  # x / 1 is x: skip the op
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
            for i in range(-(-len(live) // mb), n_passes):  # rows run out before the engine's passes do
                self.dp.idle_pass(input_ids[:1], attention_mask[:1], sync=i == n_passes - 1)
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
        if self.model.training:
            self.model.eval()
        n = cfg.num_iterations
        out = {key: (v / n if key != "grad_norm" else v) for key, v in sums.items()}
        if sampled_entropy:  # with the step's global denominators (bnpo has none: take them here)
            whole = denominators or {key: self.dp.sum(v) for key, v in agg_denominators(batch.response_mask).items()}
            out["entropy"] = float(agg_loss(batch.entropy, batch.response_mask, **{**whole, **_agg_only(agg)}))
        out["frac_rows_trained"] = len(live) / B
        return out

    def _policy_logprobs(self, input_ids, attention_mask, prompt_len: int, index, rows, temperature: float,
                         entropy: bool):
        """The policy's log-probs (and entropies) of ``rows``, with gradient. When the rows of a group
        share their prompt, each prompt goes through the model once and the response padding not at all
        (:func:`shared_prefix_logprobs`; their log-probs are then 0, which the response mask ignores)."""
        T = input_ids.shape[1] - prompt_len
        if self.config.share_prompt_forward and shared_prefix_refusal(self.model) is None:
            groups, inverse = torch.unique(index[rows], return_inverse=True)
            first = rows.new_empty(len(groups))
            first[inverse] = rows  # any row of each group: their prompts are checked equal below
            prompts, prompt_mask = input_ids[first, :prompt_len], attention_mask[first, :prompt_len]
            # a RolloutBatch's responses are right-padded: the attended tokens of each are a prefix (a
            # sampler that masks tokens inside a response gets the full forward below)
            attended = attention_mask[rows, prompt_len:]
            lengths = attended.sum(-1)
            is_prefix = torch.equal(attended, (torch.arange(T, device=rows.device) < lengths[:, None]).to(attended.dtype))
            if is_prefix and torch.equal(prompts[inverse], input_ids[rows, :prompt_len]) and \
                    torch.equal(prompt_mask[inverse], attention_mask[rows, :prompt_len]):
                lengths = lengths.clamp(min=1)
                return shared_prefix_logprobs(self.model, prompts, prompt_mask, inverse, input_ids[rows, prompt_len:],
                                              temperature, return_entropy=entropy, response_lengths=lengths)
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
        if self.output_dir is not None and self.dp.is_main:
            checkpoints.append_metrics(self.output_dir, self.history, metrics)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` into ``output_dir`` (:func:`rlcourse.checkpoints.save_checkpoint`)."""
        return checkpoints.save_checkpoint(self)

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint in ``output_dir``, or None."""
        return checkpoints.latest_checkpoint(self.output_dir)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote; the next step continues exactly
        (:func:`rlcourse.checkpoints.load_checkpoint`: resume only from checkpoints you wrote)."""
        checkpoints.load_checkpoint(self, path)


# metrics that are each process's part of a global sum (their denominators are global) or counts
GLOBAL_SUM_METRICS = {"loss", "kl", "entropy", "vf_loss", "response_tokens", "prompt_tokens"}


def distributed_seed(seed: int, rank: int, step: int) -> int:
    """The sampling seed of process ``rank`` at ``step`` in a data-parallel run: a function of the
    three alone, so a resumed run samples what the uninterrupted one did."""
    return (seed * 1_000_003 + rank) * 1_000_033 + step


def _agg_only(agg: dict) -> dict:
    keys = ("loss_agg_mode", "global_tokens", "global_seqs", "max_len")
    return {("mode" if key == "loss_agg_mode" else key): v for key, v in agg.items() if key in keys}


