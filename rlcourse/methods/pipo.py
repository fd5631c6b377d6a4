"""PIPO: closed-loop policy improvement against a sliding-window anchor.

*Policy Improvement Reinforcement Learning*, Huaiyang Wang, Xiaojie Li, Deqing Wang, Haoyi Zhou,
Zixuan Huang, Yaodong Yang, Jianxin Li and Yikun Ban (2026, arXiv:2604.00860). After sampling the
batch ``B_t``, PIPO compares its mean reward ``mu_t`` with the mean ``rho`` of the last ``K`` batch
means (the anchor) and re-applies the previous batch's learning signal with the weight
``xi_t = clip(mu_t - rho, -5, 5) / sigma`` (``sigma`` the window's standard deviation): an update
that was followed by a gain is reinforced, one followed by a drop is reversed (scaled by
``s_neg``, or skipped when ``s_neg = 0``). The algorithm and its constants follow the authors' code
(github.com/JacckMa/pipo_verl, ``layback_utils.py`` and ``ray_trainer.py``).

This module holds the pure functions (window, progress signal, gate, layback coefficients) and the
registered parts that run PIPO in the :class:`~rlcourse.train.Trainer`:

* sampler ``"pipo"``: samples with a base sampler, scores the fresh rows once, keeps the previous
  batch in ``state["pipo"]`` and appends it with per-token extras (the layback coefficient);
* policy loss ``"pipo"``: the base surrogate on the fresh rows, the layback term on the cached rows,
  each normalised over its own part.

The chapter's experiment (a contextual bandit with exact expected rewards, noisy rewards, GRPO against
GRPO + PIPO, and the tiny-LM run) is :mod:`rlcourse.studies.pipo`.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..losses import agg_loss, get_policy_loss, register_policy_loss
from ..ops import check_same_shape, masked_mean
from ..rewards import get_reward
from ..rollout import register_sampler

PAPER = ("Policy Improvement Reinforcement Learning, H. Wang, X. Li, D. Wang, H. Zhou, Z. Huang, Y. Yang, J. Li, "
         "Y. Ban (2026, arXiv:2604.00860)")
WINDOW_MODES = ("strict", "released")
DELTA_CLIP, COEF_CLIP, PHI_CLIP = 5.0, 10.0, 2.0  # the authors' clips


# ---------------------------------------------------------------------- the pure functions
def telescoping_improvement(J: np.ndarray) -> np.ndarray:
    """Cumulative PIRL objective ``sum_{s<t} (J_{s+1} - J_s)`` for ``t = 0..T`` (equal to ``J_t - J_0``).

    ======  =======  =========================================
    J       (T+1,)   performance of the policies pi_0 .. pi_T
    return  (T+1,)   the partial sums of the improvements
    ======  =======  =========================================
    """
    J = np.asarray(J, float)
    if J.ndim != 1 or J.size == 0:
        raise ValueError(f"J must be a non-empty 1-D array, got shape {J.shape}")
    return np.concatenate([[0.0], np.cumsum(np.diff(J))])


def step_window(history: list[float], mu: float, window: int = 8, mode: str = "strict"):
    """The anchor window that ``mu_t`` is compared with, and the history to keep for the next step.

    ``strict`` (the default, the paper's definition): the anchor is the last ``window`` batch means
    *before* ``t``, and ``mu_t`` is appended once after. ``released`` (the authors' trainer): ``mu_t``
    is appended before the anchor is computed and again at the end of the step, into a deque of
    length ``window``, so the anchor holds ``mu_t`` itself and about ``window / 2`` earlier steps,
    each counted twice.

    ========  =======  ==========================================================
    history   list     what the previous step returned as ``new_history``
    returns   2 lists  ``(anchor, new_history)``
    ========  =======  ==========================================================
    """
    if mode not in WINDOW_MODES:
        raise ValueError(f"window_mode must be one of {WINDOW_MODES}, got {mode!r}")
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if not np.isfinite(mu):
        raise ValueError(f"the batch mean reward mu_t must be finite, got {mu}")
    history = list(history)
    if mode == "strict":
        return history[-window:], (history + [float(mu)])[-window:]
    first = (history + [float(mu)])[-window:]
    return first, (first + [float(mu)])[-window:]


def progress_signal(mu: float, anchor: list[float], variance_normalization: bool = True,
                    eps: float = 1e-8) -> dict:
    """``Delta = clip(mu - mean(anchor), -5, 5)`` and ``xi = Delta / sigma`` with ``sigma`` the
    (population) standard deviation of the anchor, replaced by 1 when below ``eps`` or when the anchor
    has fewer than 2 entries (the authors' rule). An empty anchor gives ``Delta = xi = 0``.

    Returns ``{"delta", "xi", "rho", "sigma"}`` (floats)."""
    a = np.asarray(anchor, float)
    if a.size == 0:
        return {"delta": 0.0, "xi": 0.0, "rho": float(mu), "sigma": 1.0}
    rho = float(a.mean())
    delta = float(np.clip(mu - rho, -DELTA_CLIP, DELTA_CLIP))
    sigma = float(a.std()) if a.size >= 2 else 1.0
    sigma = 1.0 if sigma < eps else sigma
    return {"delta": delta, "xi": delta / sigma if variance_normalization else delta, "rho": rho, "sigma": sigma}


def layback_scale(delta: float, xi: float, s_neg: float = 0.1, threshold: float = 0.0) -> float:
    """The gate ``s_t``: 1 after a gain (``Delta >= 0``), ``s_neg`` after a drop, 0 (no layback step)
    when ``|xi| <= threshold`` (with ``threshold > 0``) or after a drop with ``s_neg = 0``."""
    if s_neg < 0 or threshold < 0:
        raise ValueError(f"s_neg and threshold must be >= 0, got {s_neg}, {threshold}")
    if threshold > 0 and abs(xi) <= threshold:
        return 0.0
    return 1.0 if delta >= 0 else float(s_neg)


def layback_coefficients(adv_bar: torch.Tensor, index: torch.Tensor, xi: float, eps: float = 1e-6) -> torch.Tensor:
    """``C_i = clip(n_g * Abar_i / sum_{j in g} |Abar_j| * xi, -10, 10)`` for each row ``i`` of group ``g``.

    ========  ======  =====================================================
    adv_bar   (N,)    token-mean advantage of each row of the previous batch
    index     (N,)    group (prompt) id of each row
    xi        float   the progress signal of this step
    returns   (N,)    the layback coefficients
    ========  ======  =====================================================
    """
    adv_bar = torch.as_tensor(adv_bar, dtype=torch.float64)
    index = torch.as_tensor(index, dtype=torch.long)
    if adv_bar.ndim != 1 or adv_bar.shape != index.shape:
        raise ValueError(f"adv_bar and index must be (N,) of one shape, got {tuple(adv_bar.shape)}, {tuple(index.shape)}")
    if not torch.isfinite(adv_bar).all() or not np.isfinite(xi):
        raise ValueError("adv_bar and xi must be finite")
    _, inv = torch.unique(index, return_inverse=True)
    n = torch.bincount(inv).to(torch.float64)
    abs_sum = torch.zeros(len(n), dtype=torch.float64).index_add_(0, inv, adv_bar.abs()) + eps
    return (n[inv] * adv_bar / abs_sum[inv] * xi).clamp(-COEF_CLIP, COEF_CLIP)


def sequence_mean_advantage(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` token-mean of each row's advantage over its mask (the authors' ``Abar_i``)."""
    check_same_shape(advantages=advantages, mask=mask)
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@dataclass
class PipoController:
    """The bookkeeping of one run (window, gate, warm-up), the same for the bandit and the sampler.

    ``warmup`` is the number of history entries needed before the first layback step (default
    ``window``; in ``released`` mode the authors count entries of the double-appended deque, so the
    first layback comes after ``window / 2`` steps)."""

    window: int = 8
    s_neg: float = 0.1
    threshold: float = 0.0
    window_mode: str = "strict"
    warmup: int | None = None
    variance_normalization: bool = True

    def __post_init__(self):
        step_window([], 0.0, self.window, self.window_mode)  # validates window and mode
        layback_scale(0.0, 0.0, self.s_neg, self.threshold)

    def step(self, history: list[float], mu: float) -> tuple[dict, list[float]]:
        """One step: ``(signal, new_history)``; ``signal`` holds ``delta, xi, rho, sigma``, ``ready``
        and the gate ``scale`` (0 before the warm-up)."""
        anchor, new_history = step_window(history, mu, self.window, self.window_mode)
        sig = progress_signal(mu, anchor, self.variance_normalization)
        need = self.window if self.warmup is None else self.warmup
        ready = len(anchor) >= need
        sig.update(mu=float(mu), ready=ready,
                   scale=layback_scale(sig["delta"], sig["xi"], self.s_neg, self.threshold) if ready else 0.0)
        return sig, new_history


# ---------------------------------------------------------------------- the registered loss
EXTRAS = ("pipo_coef", "pipo_phi", "pipo_cached", "pipo_tokens", "pipo_seqs")


@register_policy_loss("pipo")
def compute_pipo_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                      clip_ratio_c: float | None = None, loss_agg_mode: str = "token-mean", *,
                      global_tokens: float | None = None, global_seqs: float | None = None,
                      max_len: int | None = None, pipo_coef: torch.Tensor | None = None,
                      pipo_phi: torch.Tensor | None = None, pipo_cached: torch.Tensor | None = None,
                      pipo_tokens: torch.Tensor | None = None, pipo_seqs: torch.Tensor | None = None,
                      base_loss: str = "vanilla", base_kwargs: dict | None = None):
    """PIPO's loss: the base surrogate on the fresh rows plus the layback term on the cached rows,

    ``L = L_base(fresh rows, advantages * phi) + agg_cached[-min(r, clip(r, 1-eps_lo, 1+eps_hi)) * coef]``

    with ``r = pi_theta / pi_old`` on the cached rows (their stored behaviour log-probs) and ``coef =
    s_t * C_i`` from the ``"pipo"`` sampler. Each part is aggregated by ``loss_agg_mode`` over its own
    tokens and sequences (the counts come per token in ``pipo_tokens`` / ``pipo_seqs``, so the sum over
    micro-batches is the full-batch loss). Without the sampler's extras (another sampler, or no
    cached batch yet) the loss is the base loss.

    ============== ========= ===========================================================
    old_log_prob   ``(B,T)`` behaviour log-probs (for cached rows: those of ``pi_{t-1}``)
    log_prob       ``(B,T)`` current log-probs (gradient)
    advantages     ``(B,T)`` the loop's advantages (used on fresh rows)
    response_mask  ``(B,T)`` 1 on tokens that count
    pipo_coef      ``(B,T)`` ``s_t C_i`` on cached rows' tokens, 0 on fresh rows
    pipo_phi       ``(B,T)`` multiplier of fresh rows' advantages (1; ``clip(xi, -2, 2)`` in the
                             critic variant), 0 on cached rows
    pipo_cached    ``(B,T)`` 1 on every column of a cached row
    pipo_tokens    ``(B,T)`` on each row: its part's token count in the whole batch
    pipo_seqs      ``(B,T)`` on each row: its part's sequence count in the whole batch
    base_loss      str       registered loss applied to the fresh rows (default PPO-clip)
    returns                  ``(loss, metrics)``: the base loss's metrics plus ``pipo_layback_loss``,
                             ``pipo_cached_frac`` (share of rows that are cached), ``pipo_coef_abs``
    ============== ========= ===========================================================
    """
    from ..train import call_policy_loss

    given = [x is not None for x in (pipo_coef, pipo_phi, pipo_cached, pipo_tokens, pipo_seqs)]
    if any(given) and not all(given):
        raise ValueError(f"the pipo loss needs all of the pipo sampler's extras {EXTRAS}, or none")
    base = get_policy_loss(base_loss)
    if base is compute_pipo_loss:
        raise ValueError("base_loss cannot be 'pipo' itself")
    named = dict(old_log_prob=old_log_prob, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                 clip_ratio_c=clip_ratio_c, **(base_kwargs or {}))
    agg = dict(loss_agg_mode=loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    if max_len is not None:
        agg["max_len"] = max_len
    if not all(given):
        return call_policy_loss(base, agg, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                                **named)
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
                     pipo_coef=pipo_coef, pipo_phi=pipo_phi, pipo_cached=pipo_cached, pipo_tokens=pipo_tokens,
                     pipo_seqs=pipo_seqs)
    cached = pipo_cached[:, :1] > 0  # (b, 1)
    fresh_mask, cached_mask = response_mask * (~cached), response_mask * cached

    def counts(rows: torch.Tensor) -> tuple[float | None, float | None]:
        if global_tokens is None and global_seqs is None:  # the loop gave local denominators (bnpo)
            return None, None
        rows = rows.squeeze(-1)
        if not rows.any():
            return 1.0, 1.0  # this micro-batch holds no row of the part: its sum is 0 anyway
        return float(pipo_tokens[rows, 0].max()), float(pipo_seqs[rows, 0].max())

    n_tok, n_seq = counts(~cached)
    base_value, metrics = call_policy_loss(base, {**agg, "global_tokens": n_tok, "global_seqs": n_seq},
                                           log_prob=log_prob, advantages=advantages * pipo_phi,
                                           response_mask=fresh_mask, **named)
    log_ratio = (log_prob - old_log_prob.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    ratio_min = torch.minimum(ratio, ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high))
    c_tok, c_seq = counts(cached)
    lb = agg_loss(-ratio_min * pipo_coef.detach(), cached_mask, loss_agg_mode, global_tokens=c_tok,
                  global_seqs=c_seq, max_len=max_len)
    metrics = dict(metrics)
    with torch.no_grad():
        metrics.update(pipo_layback_loss=float(lb), pipo_cached_frac=float(cached.float().mean()),
                       pipo_coef_abs=float(masked_mean(pipo_coef.abs(), cached_mask)) if cached.any() else 0.0)
    return base_value + lb, metrics


# ---------------------------------------------------------------------- the registered sampler
def _estimator_advantages(batch, scores, per_row, config, state, step, model) -> torch.Tensor | None:
    """``(B,)`` token-mean advantages of the base estimator on ``batch`` alone (``None`` when the
    estimator needs a critic, which a sampler does not have)."""
    from ..advantages import get_estimator, place_on_last_token
    from ..train import call_with_supported, needs_values

    est = get_estimator(config.advantage_estimator)
    if needs_values(est):
        return None
    mask = batch.response_mask
    offered = dict(token_level_rewards=place_on_last_token(scores, mask), response_mask=mask, index=batch.index,
                   values=None, gamma=config.gamma, lam=config.lam,
                   norm_adv_by_std_in_grpo=config.scale_rewards == "group", batch=batch, examples=per_row,
                   scores=scores, state=copy.deepcopy({k: v for k, v in state.items() if k != "pipo"}), step=step,
                   model=model)
    adv, _ = call_with_supported(est, **offered, **batch.extras, **config.advantage_kwargs)
    if config.scale_rewards == "batch" and config.advantage_estimator == "grpo":
        adv = adv / (adv[:, 0].std() + 1e-6) * mask
    return sequence_mean_advantage(adv.float(), mask).detach()


def _with_extras(batch, coef: torch.Tensor, phi: torch.Tensor, cached: bool):
    """``batch`` with the pipo extras for its rows (row values broadcast over the tokens)."""
    B, T = batch.response_ids.shape
    m = batch.response_mask.float()
    row = lambda v: torch.as_tensor(v, dtype=torch.float32).reshape(-1, 1).expand(B, T).clone()  # noqa: E731
    extras = dict(batch.extras, pipo_coef=row(coef) * m, pipo_phi=row(phi), pipo_cached=row([float(cached)] * B),
                  pipo_tokens=row([0.0] * B), pipo_seqs=row([0.0] * B))
    return replace(batch, extras=extras)


@register_sampler("pipo")
def pipo_sampler(model, tokenizer, prompts, config, generator, state, examples, pool, task, reward, step,
                 base: str = "policy", window: int = 8, s_neg: float = 0.1, threshold: float = 0.0,
                 window_mode: str = "strict", warmup: int | None = None, variance_normalization: bool = True,
                 verdict_reward: str | None = None, base_kwargs: dict | None = None):
    """PIPO's sampler: the base sampler's fresh batch ``B_t``, scored once with the loop's reward, then
    (from the warm-up on, with ``policy_loss="pipo"``) the cached previous batch ``B_{t-1}`` appended
    with its stored scores and behaviour log-probs and the extras of :func:`compute_pipo_loss`.

    State kept in ``state["pipo"]`` (saved in checkpoints): ``history`` (the window) and ``cache`` (the
    previous fresh batch, its examples and token-mean advantages). What the step measured goes in
    ``batch.metrics``, logged by the trainer with the step's metrics:

    ================== ================================================================
    pipo_fresh_reward  mean reward of the fresh rows (the loop's ``reward`` averages over
                       the cached rows too)
    pipo_mu            ``mu_t``, the verdict's batch mean (``pipo_fresh_reward``, or the
                       ``verdict_reward``'s mean)
    pipo_delta         ``Delta_t``; ``pipo_xi``: ``xi_t``; ``pipo_rho``, ``pipo_sigma``: the anchor's
                       mean and spread
    pipo_ready         1 once the window is warm
    pipo_scale         the gate ``s_t`` (0 before the warm-up)
    pipo_layback       1 when the cached batch was appended this step
    pipo_phi           the fresh advantages' multiplier (1; ``clip(xi, -2, 2)`` in the critic variant)
    ================== ================================================================

    With an estimator that needs a critic (``gae``), no batch is cached: the fresh advantages are
    multiplied by ``phi = clip(xi, -2, 2)`` once warm (the authors' PPO variant). With a policy loss
    other than ``"pipo"``, nothing is appended (a warning says so) and the run is the base one.

    ``verdict_reward`` (a registered reward name, e.g. ``"task"``) computes ``mu_t`` with another reward
    than the one the advantages use: with the clean verifier under a noisy training reward, it is the
    oracle verdict of the chapter's positive control. ``base_kwargs`` configures the base sampler (e.g.
    ``{"lag": 2}`` for ``base="multiturn"``); a keyword it does not take is a ValueError.

    The returned batch names every row's example in ``batch.examples`` (the cached rows keep the
    examples they were sampled for). The loop's ``reward`` metric averages over the cached rows too
    (``pipo_fresh_reward`` is the fresh rows' mean), and an estimator that pools over the batch or keeps
    state sees the cached rows (group-wise estimators do not: the cached rows keep their own groups).
    """
    from ..distributed import current
    from ..parts import call_base_sampler

    if current().world_size > 1:
        raise ValueError("the pipo sampler keeps a batch-level window (mu_t of the whole batch); run it in one process")
    ctl = PipoController(window=window, s_neg=s_neg, threshold=threshold, window_mode=window_mode, warmup=warmup,
                         variance_normalization=variance_normalization)
    fresh = call_base_sampler("pipo", pipo_sampler, base, base_kwargs, locals())
    n_fresh_prompts = len(examples)
    per_row = fresh.examples if fresh.examples is not None else [examples[int(i)] for i in fresh.index]
    scores = fresh.scores if fresh.scores is not None else reward(fresh, per_row, task, state)
    scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
    if scores.shape[0] != len(fresh) or not torch.isfinite(scores).all():
        raise ValueError(f"the reward gave {tuple(scores.shape)} scores (finite?) for {len(fresh)} rows")
    fresh = replace(fresh, scores=scores)
    st = state.setdefault("pipo", {"history": [], "cache": None})
    mu = scores.mean() if verdict_reward is None else \
        torch.as_tensor(get_reward(verdict_reward)(fresh, per_row, task, state), dtype=torch.float32).mean()
    sig, st["history"] = ctl.step(st["history"], float(mu))

    def measured(layback: bool, phi: float = 1.0) -> dict[str, float]:
        """The base sampler's metrics (kept) and this step's PIPO measurements."""
        ours = {"pipo_fresh_reward": float(scores.mean()), "pipo_mu": sig["mu"], "pipo_delta": sig["delta"],
                "pipo_xi": sig["xi"], "pipo_rho": sig["rho"], "pipo_sigma": sig["sigma"],
                "pipo_ready": float(sig["ready"]), "pipo_scale": sig["scale"], "pipo_layback": float(layback),
                "pipo_phi": phi}
        clash = sorted(set(fresh.metrics) & set(ours))
        if clash:
            raise ValueError(f"the base sampler {base!r} reports metrics {clash} that the pipo sampler reports too")
        return {**fresh.metrics, **ours}

    is_pipo_loss = get_policy_loss(config.policy_loss) is compute_pipo_loss
    if not is_pipo_loss:
        warnings.warn(f"the pipo sampler runs with policy_loss={config.policy_loss!r}: no layback (use 'pipo')",
                      stacklevel=2)
        return replace(fresh, metrics=measured(False))
    adv_bar = _estimator_advantages(fresh, scores, per_row, config, state, step, model)
    B = len(fresh)
    if adv_bar is None:  # a critic estimator: the authors' PPO variant, phi on the fresh advantages
        phi = float(np.clip(sig["xi"], -PHI_CLIP, PHI_CLIP)) if sig["ready"] else 1.0
        out = _with_extras(fresh, [0.0] * B, [phi] * B, cached=False)
        return replace(_fill_counts(out), metrics=measured(False, phi))
    prev = st["cache"]
    st["cache"] = {"batch": fresh, "examples": per_row, "adv_bar": adv_bar}
    layback = prev is not None and sig["scale"] > 0
    out = _with_extras(fresh, [0.0] * B, [1.0] * B, cached=False)
    if not layback:
        return replace(_fill_counts(out), metrics=measured(False))
    from ..lm.sampling import cat_batches

    coef = sig["scale"] * layback_coefficients(prev["adv_bar"], prev["batch"].index, sig["xi"])
    old = prev["batch"]
    old_part = _with_extras(old, coef, [0.0] * len(old), cached=True)
    if old_part.attention is None and out.attention is not None:
        old_part = replace(old_part, attention=old_part.response_mask.clone())
    if out.attention is None and old_part.attention is not None:
        out = replace(out, attention=out.response_mask.clone())
    if int(out.index.max()) + 1 != n_fresh_prompts:
        raise ValueError(f"the base sampler's group ids must be 0..{n_fresh_prompts - 1} (one per prompt)")
    out = replace(out, examples=per_row)  # each row carries its example (batch.examples)
    old_part = replace(old_part, examples=list(prev["examples"]))
    return replace(_fill_counts(cat_batches([out, old_part], tokenizer.pad_token_id)), metrics=measured(True))


def _fill_counts(batch):
    """Write each part's token and sequence counts into ``pipo_tokens`` / ``pipo_seqs``."""
    cached = batch.extras["pipo_cached"][:, 0] > 0
    m = batch.response_mask
    tokens, seqs = torch.zeros(len(batch)), torch.zeros(len(batch))
    for part in (cached, ~cached):
        tokens[part] = float(m[part].sum())
        seqs[part] = float((m[part].sum(-1) > 0).sum())
    T = m.shape[1]
    return replace(batch, extras=dict(batch.extras, pipo_tokens=tokens[:, None].expand(-1, T).clone(),
                                      pipo_seqs=seqs[:, None].expand(-1, T).clone()))
