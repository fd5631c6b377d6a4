"""OTB: the optimal token baseline, a per-position group baseline weighted by gradient energy.

Li et al. (2026), *The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL*,
arXiv:2602.07078. For response ``i`` of a group and position ``t``:

* per-token energy :math:`w_t = \\|\\nabla_{z_t} \\log\\pi(y_t)\\|^2 = 1 - 2\\pi_t + \\sum_v \\pi_v^2` (the
  logit-gradient proxy), with :math:`\\pi_t = \\pi(y_t \\mid \\cdot)` and
  :math:`\\sum_v \\pi_v^2 = \\exp(\\mathrm{LSE}(2z) - 2\\,\\mathrm{LSE}(z))`;
* realized energy :math:`W_t = \\sum_{j \\le t} w_j m_j`, reward-to-go :math:`G_t = \\sum_{j\\ge t} r_j m_j`;
* baseline :math:`B_t = \\sum_i G^{(i)}_t W^{(i)}_t m^{(i)}_t / (\\sum_i W^{(i)}_t m^{(i)}_t + \\epsilon)` and
  advantage :math:`A^{(i)}_t = (G^{(i)}_t - B_t)\\, m^{(i)}_t`.

Registers the advantage estimator ``"otb"`` and the sampler ``"otb_policy"`` (the policy sampler plus
one no-grad forward pass that records ``batch.extras["sum_pi_sq"]``, as verl's actor emits it). Also here: the
tabular policy whose gradients are exact (:class:`TabularAR`), its gradient variance and oracle bound, and the
true per-token gradient norms the proxy is checked against; the chapter's experiments that use them are in
:mod:`rlcourse.studies.otb`.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from ..advantages import outcome_scores, register_estimator
from ..lm.model import position_ids_from_mask
from ..ops import as_index, check_finite, check_same_shape
from ..rollout import policy_sampler, register_sampler

__all__ = ["sum_pi_sq_from_logits", "logit_grad_energy", "otb_advantage", "otb_policy_sampler", "batch_sum_pi_sq",
           "response_sum_pi_sq", "per_token_param_grad_sq", "TabularAR", "tabular_gradient_variance",
           "tabular_oracle_nsr"]


# ---------------------------------------------------------------------- the proxy
def sum_pi_sq_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """:math:`\\sum_v \\mathrm{softmax}(z)_v^2` computed stably as :math:`\\exp(\\mathrm{LSE}(2z) - 2\\,\\mathrm{LSE}(z))`.

    ======= ============ ===================================
    logits  ``(..., V)`` logits z (already divided by the temperature)
    returns ``(...)``    float32 sum of squared probabilities, in (0, 1]
    ======= ============ ===================================
    """
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a vocabulary axis, got shape {tuple(logits.shape)}")
    z = logits.float()
    return torch.exp(torch.logsumexp(2 * z, -1) - 2 * torch.logsumexp(z, -1))


def logit_grad_energy(logprobs: torch.Tensor, sum_pi_sq: torch.Tensor) -> torch.Tensor:
    """The logit-gradient proxy :math:`w_t = \\|e_{y_t} - \\pi_t\\|^2 = 1 - 2\\pi_t + \\sum_v \\pi_v^2`.

    ========= ========= ==============================================
    logprobs  ``(B,T)`` log pi(y_t) of the sampled tokens
    sum_pi_sq ``(B,T)`` sum over the vocabulary of pi_v^2 at each position
    returns   ``(B,T)`` squared norm of d log pi(y_t) / d logits, in [0, 2)
    ========= ========= ==============================================
    """
    check_same_shape(logprobs=logprobs, sum_pi_sq=sum_pi_sq)
    return (1.0 - 2.0 * logprobs.float().exp() + sum_pi_sq.float()).clamp(min=0.0)


# ---------------------------------------------------------------------- the estimator
@register_estimator("otb")
def otb_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, batch=None,
                  logprobs: torch.Tensor | None = None, sum_pi_sq: torch.Tensor | None = None,
                  epsilon: float = 1e-8, handle_zero_tail: bool = True, model=None):
    """OTB's advantage :math:`A^{(i)}_t = (G^{(i)}_t - B_t) m^{(i)}_t` with the energy-weighted
    per-position group baseline :math:`B_t` (no division by the group's std).

    =================== ============ =============================================================
    token_level_rewards ``(B,T)``    rewards (outcome on the last valid token)
    response_mask       ``(B,T)``    1 up to and including EOS
    index               ``(B,)``     group (prompt) id of each row
    batch               RolloutBatch or None: supplies ``logprobs`` when not passed directly
    model               the policy   that sampled ``batch`` (the trainer passes it): when no
                                     ``sum_pi_sq`` is given (the trainer passes ``batch.extras``,
                                     where the ``"otb_policy"`` sampler puts it), it is computed
                                     from ``model`` on ``batch``, so any sampler combines with OTB
    logprobs            ``(B,T)``    log pi_old(y_t) at the sampling temperature
    sum_pi_sq           ``(B,T)``    sum_v pi_old(v)^2 at each position
    handle_zero_tail    bool         positions past the second-longest response of a group get
                                     baseline 0 (a lone tail is not baselined against itself)
    returns                          ``(adv, ret)``, both ``(B,T)``; ``ret`` is the reward-to-go G_t
    =================== ============ =============================================================
    """
    if logprobs is None and batch is not None:
        logprobs = batch.logprobs
    if sum_pi_sq is None and batch is not None:
        sum_pi_sq = batch.extras.get("sum_pi_sq")
        if sum_pi_sq is None and model is not None:
            sum_pi_sq = batch_sum_pi_sq(model, batch)
    if logprobs is None or sum_pi_sq is None:
        raise ValueError("the 'otb' estimator needs per-token logprobs and sum_pi_sq; train with "
                         "sampler='otb_policy' (which records batch.extras['sum_pi_sq']), pass the model "
                         "that sampled the batch, or pass them directly")
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask, logprobs=logprobs,
                     sum_pi_sq=sum_pi_sq)
    check_finite("token_level_rewards", token_level_rewards)
    check_finite("sum_pi_sq", sum_pi_sq)
    B, T = response_mask.shape
    idx = as_index(index, B)
    _, group = torch.unique(idx, return_inverse=True)
    n_groups = int(group.max()) + 1
    mask = response_mask.double()
    r = token_level_rewards.double() * mask
    returns = r.flip(-1).cumsum(-1).flip(-1) * mask  # G_t = sum_{j >= t} r_j m_j
    w = logit_grad_energy(logprobs, sum_pi_sq).double() * mask
    W = w.cumsum(-1) * mask  # realized energy of the prefix
    num = torch.zeros(n_groups, T, dtype=torch.float64).index_add_(0, group, returns * W * mask)
    den = torch.zeros(n_groups, T, dtype=torch.float64).index_add_(0, group, W * mask)
    baseline = num / (den + epsilon)
    if handle_zero_tail:
        # count of valid rows per (group, position); fewer than 2 means a lone tail: baseline 0
        alive = torch.zeros(n_groups, T, dtype=torch.float64).index_add_(0, group, mask)
        baseline = torch.where(alive >= 2, baseline, torch.zeros_like(baseline))
    adv = (returns - baseline[group]) * mask
    return adv.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@torch.no_grad()
def response_sum_pi_sq(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                       temperature: float = 1.0) -> torch.Tensor:
    """Per-position :math:`\\sum_v \\pi(v)^2` of the response, at the sampling temperature.

    ============== =========== =============================================
    input_ids      ``(B,P+T)`` prompt (left-padded) then response
    attention_mask ``(B,P+T)`` 1 on real tokens
    returns        ``(B,T)``   sum of squared next-token probabilities
    ============== =========== =============================================
    """
    T = int(response_len)
    if not 0 < T < input_ids.shape[1]:
        raise ValueError(f"response_len must be in [1, {input_ids.shape[1] - 1}], got {response_len}")
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False, logits_to_keep=T + 1)
    return sum_pi_sq_from_logits(out.logits[:, :-1, :].float() / temperature)


def batch_sum_pi_sq(model, batch) -> torch.Tensor:
    """``(B,T)`` :func:`response_sum_pi_sq` of a rollout batch under ``model`` in eval mode, zero
    where the response is masked."""
    was_training = model.training
    model.eval()
    try:
        s = response_sum_pi_sq(model, batch.input_ids, batch.attention_mask, batch.response_len, batch.temperature)
    finally:
        model.train(was_training)
    return s * batch.response_mask


@register_sampler("otb_policy")
def otb_policy_sampler(model, tokenizer, prompts, config, generator, state):
    """The ``"policy"`` sampler, plus ``batch.extras["sum_pi_sq"]`` ``(B,T)`` from one no-grad forward
    pass (zero where the response is masked), which the ``"otb"`` estimator reads. (Without it the
    estimator computes the same quantity itself, after the rollout.)"""
    batch = policy_sampler(model, tokenizer, prompts, config, generator, state)
    batch.extras["sum_pi_sq"] = batch_sum_pi_sq(model, batch)
    return batch


def per_token_param_grad_sq(model, batch, rows) -> tuple[np.ndarray, np.ndarray]:
    """True squared parameter-gradient norms :math:`\\|\\nabla_\\theta \\log\\pi(y_t)\\|^2` of each valid
    token of the given rows (one backward pass per token), beside the proxy :math:`w_t`.

    ======= =========== =====================================================
    rows    ``(k,)``    row indices of ``batch`` to examine
    returns             (true, proxy), each ``(n_tokens,)`` over the valid tokens of those rows
    ======= =========== =====================================================
    """
    from ..lm.model import logprobs_from_logits
    rows = torch.as_tensor(rows, dtype=torch.long)
    ids, att = batch.input_ids[rows], batch.attention_mask[rows]
    T = batch.response_len
    params = [p for p in model.parameters() if p.requires_grad]
    out = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att), use_cache=False,
                logits_to_keep=T + 1)
    logits = out.logits[:, :-1, :].float() / batch.temperature
    logp = logprobs_from_logits(logits, ids[:, -T:])
    proxy = logit_grad_energy(logp.detach(), sum_pi_sq_from_logits(logits.detach()))
    mask = batch.response_mask[rows]
    true, prox = [], []
    for b, t in (mask > 0).nonzero().tolist():
        grads = torch.autograd.grad(logp[b, t], params, retain_graph=True, allow_unused=True)
        true.append(float(sum((g.double() ** 2).sum() for g in grads if g is not None)))
        prox.append(float(proxy[b, t]))
    return np.array(true), np.array(prox)


# ---------------------------------------------------------------------- exact enumeration
class TabularAR:
    """A tabular autoregressive policy over the tokens ``{0, 1, EOS}`` with at most ``max_len`` tokens:
    every prefix (without EOS) has its own logits, so the parameter gradient of a token's log-prob
    *is* its logit gradient, and every response can be enumerated.

    ============== ============== ==============================================
    attribute      shape          meaning
    ============== ============== ==============================================
    logits         ``(C,3)``      logits of each context (prefix), C = 2^max_len - 1
    seqs           ``n`` lists    every response, as token lists (EOS = 2)
    prob           ``(n,)``       probability of each response
    reward         ``(n,)``       reward: 1 if at least ``need`` ones before EOS
    score          ``(n,L,3C)``   per-token gradient of log pi(y_t) w.r.t. all logits
    logp, sumsq    ``(n,L)``      log pi(y_t) and sum_v pi_v^2 per position (0 past the end)
    mask           ``(n,L)``      1 on the response's tokens (including EOS)
    ============== ============== ==============================================
    """

    def __init__(self, max_len: int = 5, seed: int = 0, scale: float = 1.5, need: int = 3):
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        rng = np.random.default_rng(seed)
        self.max_len, L = max_len, max_len
        prefixes = [p for n in range(L) for p in itertools.product((0, 1), repeat=n)]
        self.ctx = {p: i for i, p in enumerate(prefixes)}
        C = len(prefixes)
        self.logits = rng.normal(0, scale, (C, 3))
        pi = np.exp(self.logits - self.logits.max(1, keepdims=True))
        pi /= pi.sum(1, keepdims=True)
        seqs = [list(p) + [2] for n in range(L) for p in itertools.product((0, 1), repeat=n)]
        seqs += [list(p) for p in itertools.product((0, 1), repeat=L)]
        n = len(seqs)
        self.seqs = seqs
        self.prob, self.reward = np.ones(n), np.zeros(n)
        self.score = np.zeros((n, L, 3 * C))
        self.logp, self.sumsq, self.mask = np.zeros((n, L)), np.zeros((n, L)), np.zeros((n, L))
        for k, s in enumerate(seqs):
            for t, a in enumerate(s):
                c = self.ctx[tuple(s[:t])]
                self.prob[k] *= pi[c, a]
                g = -pi[c].copy()
                g[a] += 1.0
                self.score[k, t, 3 * c:3 * c + 3] = g
                self.logp[k, t] = np.log(pi[c, a])
                self.sumsq[k, t] = (pi[c] ** 2).sum()
                self.mask[k, t] = 1.0
            self.reward[k] = float(sum(1 for a in s if a == 1) >= need)

    def true_gradient(self) -> np.ndarray:
        """Exact :math:`\\nabla J = \\sum_y p(y) R(y) \\sum_t \\nabla\\log\\pi(y_t)`, ``(3C,)``."""
        return np.einsum("n,n,nld->d", self.prob, self.reward, self.score)


def tabular_gradient_variance(env: TabularAR, group_size: int, baseline: str, n_groups: int = 4000,
                              seed: int = 0, chunk: int = 2000, handle_zero_tail: bool = True) -> dict:
    """Monte-Carlo variance of the one-group policy-gradient estimate
    :math:`\\hat g = \\frac1N \\sum_i \\sum_t A^{(i)}_t \\nabla\\log\\pi(y^{(i)}_t)` on the tabular policy.

    ``baseline``: ``"mean"`` (group mean, A = R - mean), ``"rloo"`` (leave-one-out mean), ``"otb"``
    (:func:`otb_advantage`, with ``handle_zero_tail``) or ``"none"``. The same ``seed`` draws the same
    groups for every baseline of the same ``group_size``. Returns ``total_var`` (trace of the covariance of
    :math:`\\hat g`), ``mean`` (its average, ``(3C,)``), ``nsr`` (total_var / squared norm of the
    mean: noise-to-signal, invariant to a rescaling of the advantages) and ``cos`` (cosine between
    the average and the true gradient).
    """
    if baseline not in ("mean", "rloo", "otb", "none"):
        raise ValueError(f"baseline must be 'mean', 'rloo', 'otb' or 'none', got {baseline!r}")
    if group_size < 1 or (baseline in ("mean", "rloo") and group_size < 2):
        raise ValueError(f"group_size {group_size} is too small for baseline {baseline!r}")
    rng = np.random.default_rng(seed)
    N, L = group_size, env.max_len
    grads = []
    per_chunk = max(1, chunk // N)
    for start in range(0, n_groups, per_chunk):
        g_n = min(per_chunk, n_groups - start)
        pick = rng.choice(len(env.prob), size=(g_n, N), p=env.prob).reshape(-1)
        R = torch.tensor(env.reward[pick])
        mask = torch.tensor(env.mask[pick])
        index = torch.arange(g_n).repeat_interleave(N)
        if baseline == "otb":
            last = mask.sum(-1).long() - 1
            tlr = torch.zeros_like(mask)
            tlr[torch.arange(len(pick)), last] = R
            adv, _ = otb_advantage(tlr, mask, index, logprobs=torch.tensor(env.logp[pick]),
                                   sum_pi_sq=torch.tensor(env.sumsq[pick]), handle_zero_tail=handle_zero_tail)
            A = adv.numpy()
        else:
            Rg = env.reward[pick].reshape(g_n, N)
            if baseline == "mean":
                b = Rg.mean(1, keepdims=True).repeat(N, 1)
            elif baseline == "rloo":
                b = (Rg.sum(1, keepdims=True) - Rg) / (N - 1)
            else:
                b = np.zeros_like(Rg)
            A = ((Rg - b).reshape(-1, 1) * env.mask[pick])
        row = np.einsum("rl,rld->rd", A, env.score[pick])
        grads.append(row.reshape(g_n, N, -1).mean(1))
    g = np.concatenate(grads)
    mean = g.mean(0)
    total = float(((g - mean) ** 2).sum(1).mean())
    true = env.true_gradient()
    return {"total_var": total, "mean": mean, "nsr": total / float(mean @ mean),
            "cos": float(mean @ true / np.linalg.norm(mean) / np.linalg.norm(true))}


# ---------------------------------------------------------------------- the oracle bound on the tabular policy
def tabular_oracle_nsr(env: TabularAR, group_size: int) -> dict:
    """Exact noise-to-signal ratio of the one-group gradient with an *oracle* baseline, by enumeration.

    Two oracles, both functions of the prefix only (so both unbiased): ``value``, the exact value
    :math:`V(y_{<t}) = \\mathbb E[R \\mid y_{<t}]`, and ``optimal``, the exact variance-optimal per-prefix
    baseline :math:`b^\\star(y_{<t}) = \\mathbb E[w_t R \\mid y_{<t}] / \\mathbb E[w_t \\mid y_{<t}]` (optimal because
    the tabular scores of different prefixes are orthogonal, exercise 3). A baseline that does not
    depend on the other samples makes the ``N`` samples of a group independent, so
    :math:`\\mathrm{NSR}(N) = \\mathrm{Var}_1 / (N \\|\\nabla J\\|^2)`: no baseline of this kind can beat it.

    ============ ===== ============================================================
    group_size   int   N
    returns      dict  ``value``, ``optimal``: the NSR at this N; ``none``: without baseline
    ============ ===== ============================================================
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    C = len(env.ctx)
    w = env.mask * (1.0 - 2.0 * np.exp(env.logp) + env.sumsq)  # (n, L): per-token logit energy
    ctx = np.zeros(env.mask.shape, dtype=int)
    for k, s in enumerate(env.seqs):
        for t in range(len(s)):
            ctx[k, t] = env.ctx[tuple(s[:t])]
    pm = env.prob[:, None] * env.mask
    R = env.reward[:, None] * np.ones_like(env.mask)
    den_v, num_v = np.zeros(C), np.zeros(C)
    den_o, num_o = np.zeros(C), np.zeros(C)
    np.add.at(den_v, ctx, pm)
    np.add.at(num_v, ctx, pm * R)
    np.add.at(den_o, ctx, pm * w)
    np.add.at(num_o, ctx, pm * w * R)
    true = env.true_gradient()
    signal = float(true @ true)
    out = {}
    for name, b in (("value", num_v / np.maximum(den_v, 1e-300)), ("optimal", num_o / np.maximum(den_o, 1e-300)),
                    ("none", np.zeros(C))):
        A = (R - b[ctx]) * env.mask
        g = np.einsum("nl,nld->nd", A, env.score)
        var1 = float(env.prob @ (g * g).sum(1)) - signal
        out[name] = var1 / (group_size * signal)
    return out
