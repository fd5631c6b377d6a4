"""Measured costs: the stage times of rlcourse's own RL loop (decode steps, Trainer stages, prefill),
turned into the simulator's :class:`StageCosts`. Torch is imported inside the functions that time
the model, so importing this module does not load it. The chapter's measured sweep is
:func:`rlcourse.studies.jigsawrl.run_measured_jigsaw_experiment`."""
from __future__ import annotations

import numpy as np

from ..profiles import Profile, profile as current_profile
from .costs import StageCosts, fit_decode_cost

MEASURED_STAGES = ("reward", "ref", "train")


def _finite_pair(pair, name: str) -> tuple[float, float]:
    values = tuple(float(v) for v in np.asarray(pair, dtype=float).reshape(-1))
    if len(values) != 2 or not all(np.isfinite(values)):
        raise ValueError(f"{name} must be two finite numbers (intercept, slope), got {pair!r}")
    return values


def stage_costs_from_seconds(decode_fit, per_token_seconds: dict, prefill_fit, tau: int = 4) -> StageCosts:
    """Measured seconds to :class:`StageCosts` in the simulator's unit, the fixed cost ``a`` of one decode step.

    Every duration is divided by ``a``, so ``decode_step = 1``. Scaling all durations by one factor
    changes no scheduling decision (see the chapter), so the choice of unit loses nothing.

    ================= ============ ===========================================================
    decode_fit        ``(a, b)``    seconds: a decode step with ``n`` active rows takes ``a + b n``
    per_token_seconds dict         seconds per token of ``"reward"``, ``"ref"`` and ``"train"``
    prefill_fit       ``(f, g)``    seconds: re-prefilling ``N`` tokens (a migration) takes ``f + g N``
    tau               int          migration threshold, kept as is
    returns           StageCosts   ``decode_step=1, decode_per_seq=b/a, *_per_token=s/a,``
                                   ``mig_fixed=f/a, mig_per_token=g/a``
    ================= ============ ===========================================================
    """
    a, b = _finite_pair(decode_fit, "decode_fit")
    f, g = _finite_pair(prefill_fit, "prefill_fit")
    if a <= 0:
        raise ValueError(f"the fixed cost of a decode step must be > 0 seconds to serve as the unit, got a={a!r}")
    if b < 0 or f < 0 or g < 0:
        raise ValueError(f"decode slope b={b!r} and prefill fit f={f!r}, g={g!r} must be >= 0 seconds")
    if not isinstance(per_token_seconds, dict) or set(per_token_seconds) != set(MEASURED_STAGES):
        got = sorted(per_token_seconds) if isinstance(per_token_seconds, dict) else type(per_token_seconds).__name__
        raise ValueError(f"per_token_seconds must have exactly the keys {MEASURED_STAGES}, got {got}")
    per = {k: float(v) for k, v in per_token_seconds.items()}
    for k, v in per.items():
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"per_token_seconds[{k!r}] must be finite and >= 0, got {v!r}")
    return StageCosts(decode_step=1.0, decode_per_seq=b / a, reward_per_token=per["reward"] / a,
                      ref_per_token=per["ref"] / a, train_per_token=per["train"] / a,
                      mig_fixed=f / a, mig_per_token=g / a, tau=tau)


class _NeverEOS:
    """A tokenizer proxy whose EOS id matches no token, so that ``sample`` decodes every step."""

    eos_token_id = -1

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


def _check_sizes(values, name: str) -> list[int]:
    out = [int(v) for v in values]
    if len(out) == 0 or any(v < 1 for v in out) or any(v != u for v, u in zip(out, values)):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
    return out


def time_decode_steps(model, tokenizer, prompts, batch_sizes, steps=(8, 40), repeats: int = 5):
    """Seconds per decode step of :func:`rlcourse.lm.sample` (the loop's synchronous engine).

    For each batch size, each repeat times one ``sample`` call of ``steps[0]`` and one of ``steps[1]``
    new tokens with EOS disabled (every row decodes to the end). The difference cancels the prefill
    and the bookkeeping; the median over repeats of ``(t_long - t_short) / (steps[1] - steps[0])``
    is the time of one decode step with ``n`` active rows.

    =========== ======== ==========================================================
    prompts     list     prompt strings, reused cyclically to fill a batch
    batch_sizes ``(S,)``  rows per call, the active sequences ``n`` of every step
    steps       (s, l)   new tokens of the short and the long call, ``s < l``
    returns     (n, t)   ``(S,)`` batch sizes and ``(S,)`` median seconds per step
    =========== ======== ==========================================================
    """
    import time

    import torch

    from ..lm.sampling import sample

    sizes = _check_sizes(batch_sizes, "batch_sizes")
    short, long_ = (int(s) for s in steps)
    if not 1 <= short < long_:
        raise ValueError(f"steps must be (short, long) with 1 <= short < long, got {steps!r}")
    if not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty")
    never = _NeverEOS(tokenizer)
    gen = torch.Generator().manual_seed(0)
    per_step = []
    for n in sizes:
        rows = [prompts[i % len(prompts)] for i in range(n)]
        sample(model, never, rows, max_new_tokens=short, generator=gen)  # warm-up
        diffs = []
        for _ in range(int(repeats)):
            t = []
            for new in (short, long_):
                t0 = time.perf_counter()
                batch = sample(model, never, rows, max_new_tokens=new, generator=gen)
                t.append(time.perf_counter() - t0)
                if batch.response_ids.shape[1] != new:
                    raise RuntimeError(f"sample stopped after {batch.response_ids.shape[1]} of {new} steps")
            diffs.append((t[1] - t[0]) / (long_ - short))
        per_step.append(float(np.median(diffs)))
    return np.array(sizes, dtype=float), np.array(per_step)


def time_prefill(model, tokenizer, prompt: str, rows, lengths, repeats: int = 5):
    """Seconds of a one-token ``sample`` call on ``rows`` prompts of ``lengths`` characters: a prefill.

    A migrated sequence is re-prefilled on its new worker (prompt and the response so far), so this
    is the cost a migration pays. Fit ``f + g N`` to the result with :func:`fit_decode_cost`.

    ======= ======== ===================================================
    prompt  str      text repeated to build prompts of a given length
    rows    ``(R,)``  batch sizes
    lengths ``(Q,)``  prompt lengths in characters
    returns (N, t)   ``(R*Q,)`` prompt tokens per call, median seconds
    ======= ======== ===================================================
    """
    import time

    import torch

    from ..lm.sampling import encode_prompts, sample

    rows, lengths = _check_sizes(rows, "rows"), _check_sizes(lengths, "lengths")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    gen = torch.Generator().manual_seed(0)
    tokens, seconds = [], []
    for n in rows:
        for ell in lengths:
            text = (prompt * (ell // len(prompt) + 1))[:ell]
            batch = [text] * n
            tokens.append(int(encode_prompts(tokenizer, batch)[1].sum()))
            sample(model, tokenizer, batch, max_new_tokens=1, generator=gen)  # warm-up
            t = []
            for _ in range(int(repeats)):
                t0 = time.perf_counter()
                sample(model, tokenizer, batch, max_new_tokens=1, generator=gen)
                t.append(time.perf_counter() - t0)
            seconds.append(float(np.median(t)))
    return np.array(tokens, dtype=float), np.array(seconds)


def time_trainer_stages(model, tokenizer, task, prof: Profile, steps: int = 3, beta: float = 0.04,
                        seed: int = 0) -> dict:
    """Per-step stage seconds and token counts of a short :class:`rlcourse.train.Trainer` run.

    The run trains a copy of ``model`` (the caller's weights are untouched) with ``beta > 0``, so a
    frozen reference exists and ``time_reference`` is measured. One warm-up step is run and dropped.

    ======= ======== ===========================================================
    steps   int      timed steps ``K`` (after the warm-up)
    returns dict     ``(K,)`` arrays: time_rollout, time_reward, time_reference,
                     time_update, prompt_tokens, response_tokens
    ======= ======== ===========================================================
    """
    import copy

    from ..lm.zoo import max_new_tokens_for
    from ..tasks import get_task
    from ..train import RLConfig, Trainer

    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0 so that the reference stage runs, got {beta!r}")
    task = get_task(task)
    cfg = RLConfig(beta=beta, steps=steps + 1, prompts_per_step=prof.rl_prompts, num_generations=prof.num_generations,
                   max_completion_length=max_new_tokens_for(task), learning_rate=prof.rl_lr, seed=seed,
                   train_pool_size=256, eval_prompts=1, progress=False)
    trainer = Trainer(copy.deepcopy(model), tokenizer, task, cfg)
    history = [trainer.step() for _ in range(steps + 1)][1:]
    keys = ("time_rollout", "time_reward", "time_reference", "time_update", "prompt_tokens", "response_tokens")
    return {k: np.array([h[k] for h in history], dtype=float) for k in keys}


def measure_stage_costs(model, tokenizer, task, prof: Profile | None = None, tau: int = 4, beta: float = 0.04,
                        seed: int = 0) -> tuple[StageCosts, dict]:
    """The stage costs of rlcourse's own loop on this machine, as :class:`StageCosts` (unit: ``a``).

    * decode: :func:`time_decode_steps` at several batch sizes, fitted to ``a + b n``;
    * reward, reference, training: seconds per token (prompt and response) of a short
      :func:`time_trainer_stages` run, median over its steps;
    * migration: :func:`time_prefill` fitted to ``f + g N`` (fixed cost ``f``, ``g`` per token);
    * response lengths: ``RolloutBatch.lengths`` of the model on the task's prompts, as the loop samples.

    ========= ============ ==============================================================
    model     LM           the tiny policy (weights are not changed)
    task      str/Task     prompts for timing and for the lengths
    returns   (costs, d)   :class:`StageCosts`; ``d`` holds the raw seconds, fits and lengths
    ========= ============ ==============================================================
    """
    import time

    import torch

    from ..lm.sampling import sample
    from ..lm.zoo import max_new_tokens_for
    from ..tasks import get_task

    prof = prof or current_profile()
    task = get_task(task)
    t0 = time.perf_counter()
    prompts = [e.prompt for e in task.examples(prof.pick(smoke=16, book=64), seed=seed)]
    reps = prof.pick(smoke=3, book=9)
    n, step_s = time_decode_steps(model, tokenizer, prompts, prof.pick(smoke=[1, 4, 16], book=[1, 2, 4, 8, 16, 32, 64]),
                                  steps=prof.pick(smoke=(4, 12), book=(8, 40)), repeats=reps)
    a, b = fit_decode_cost(n, step_s)
    pre_tok, pre_s = time_prefill(model, tokenizer, prompts[0], prof.pick(smoke=[1, 8], book=[1, 4, 16]),
                                  prof.pick(smoke=[8, 32], book=[8, 24, 48]), repeats=reps)
    f, g = fit_decode_cost(pre_tok, pre_s)
    stages = time_trainer_stages(model, tokenizer, task, prof, steps=prof.pick(smoke=1, book=4), beta=beta, seed=seed)
    tokens = stages["prompt_tokens"] + stages["response_tokens"]
    per_token = {stage: float(np.median(stages[key] / tokens)) for stage, key in
                 (("reward", "time_reward"), ("ref", "time_reference"), ("train", "time_update"))}
    clipped = [name for name, v in (("b", b), ("f", f), ("g", g)) if v < 0]  # noise can push a fit below 0
    costs = stage_costs_from_seconds((a, max(b, 0.0)), per_token, (max(f, 0.0), max(g, 0.0)), tau=tau)
    gen = torch.Generator().manual_seed(seed)
    rollout = sample(model, tokenizer, prompts, num_generations=prof.num_generations,
                     max_new_tokens=max_new_tokens_for(task), temperature=1.0, generator=gen)
    details = {"n": n, "step_seconds": step_s, "decode_fit": (a, b), "prefill_tokens": pre_tok,
               "prefill_seconds": pre_s, "prefill_fit": (f, g), "stages": stages, "per_token_seconds": per_token,
               "lengths": rollout.lengths.numpy().astype(np.int64), "truncated": float(rollout.truncated.float().mean()),
               "clipped": clipped, "seconds": time.perf_counter() - t0}
    return costs, details
