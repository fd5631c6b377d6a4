"""R2PO: a residual rollout head that explores at training time and is dropped at inference.

*R^2PO: Decoupling Training Trajectories from Inference Responses for LLM Reasoning* (Residual
Rollout Policy Optimization), Jingchu Wang, Bingbing Xu, Yige Yuan, Bin Xie, Xiaoqian Sun and Huawei
Shen (2026, arXiv:2601.11960). A small MLP ``f_phi`` on the last hidden state ``h_t`` adds to the
logits, ``z_roll = W_lm h_t + f_phi(h_t)``; the training rollouts are drawn from
``pi_{theta,phi} = softmax(z_roll / T)``, the head is trained (LM frozen) with a *rarity* advantage
that rewards outcomes rare in their group, and at inference the head is off: the model answers with
``pi_theta``. The head's shape, its two objectives and the alternation of stages follow the authors'
code (github.com/RRPO-ARR/Code, ``simple_grpo_v1/qwen_with_adaptor.py``, ``rollout_head_train.py``,
``adaptor_grpo_split.py``); the released policy update weights the head's samples by
``pi_theta / pi_old`` (head off in both). The corrected weight ``pi_old / pi_{old,phi}`` is this
course's derivation.

Parts registered here:

* sampler ``"r2po"``: keeps the head and its optimiser in ``state["r2po"]`` (restored exactly on
  resume), runs the head's stages, draws the step's rollouts with the head on and records their
  behaviour log-probabilities in ``extras["behaviour_logprob"]``; ``batch.logprobs`` are the inference
  policy's, so every existing loss runs the authors' (uncorrected) update;
* policy loss ``"r2po"``: PPO-clip with each token's advantage multiplied by
  ``w_t = pi_old(y_t) / mu(y_t)`` (the corrected ratio): the shared ``"behaviour_is"`` loss of
  :mod:`rlcourse.methods.behaviour_is` under the chapter's name;
* reward ``"r2po_format"``: the authors' reward (correct +-1, format +1.25 / -1);

and the exact expected updates of a softmax bandit (:func:`bandit_gradients`), the derivation's check. The
chapter's experiments (the bandit's ascent curves, the tiny-LM runs, the head-learning-rate rule and the
claims) are in :mod:`rlcourse.studies.r2po`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import numpy as np
import torch

from ..losses import register_policy_loss
from ..metrics import distinct_count
from ..ops import check_same_shape, masked_mean
from ..rewards import register_reward
from ..rollout import register_sampler
from .behaviour_is import compute_behaviour_is_loss

PAPER = ("R^2PO: Decoupling Training Trajectories from Inference Responses for LLM Reasoning, J. Wang, B. Xu, "
         "Y. Yuan, B. Xie, X. Sun, H. Shen (2026, arXiv:2601.11960)")


# ---------------------------------------------------------------------- the head
class RolloutHead(torch.nn.Module):
    """``f_phi(h) = W_2 ReLU(W_1 h)``, a residual on the logits (the authors' ``RolloutHead``).

    ``init="zero_last"`` (default): ``W_1`` random (std ``1/sqrt(d)``), ``W_2 = 0``, so ``f = 0``
    exactly at the start and ``W_2`` gets a gradient at once (with both layers at zero neither
    would ever get one). ``init="authors"``: both ``N(0, 1e-6)`` (the authors' ``random_init``).

    ====== ============ ==========================================
    h      ``(..., d)`` last hidden state (after the final norm)
    return              ``(..., V)``  the residual added to the logits
    ====== ============ ==========================================
    """

    def __init__(self, hidden: int, vocab: int, width: int | None = None, init: str = "zero_last", seed: int = 0):
        super().__init__()
        if hidden < 1 or vocab < 1 or (width is not None and width < 1):
            raise ValueError(f"hidden, vocab and width must be positive, got {hidden}, {vocab}, {width}")
        if init not in ("zero_last", "authors"):
            raise ValueError(f"init must be 'zero_last' or 'authors', got {init!r}")
        width = width or hidden
        self.layer1 = torch.nn.Linear(hidden, width, bias=False)
        self.layer2 = torch.nn.Linear(width, vocab, bias=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if init == "zero_last":
                self.layer1.weight.copy_(torch.randn(width, hidden, generator=gen) / math.sqrt(hidden))
                self.layer2.weight.zero_()
            else:
                self.layer1.weight.copy_(torch.randn(width, hidden, generator=gen) * 1e-6)
                self.layer2.weight.copy_(torch.randn(vocab, width, generator=gen) * 1e-6)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.layer2(torch.relu(self.layer1(h)))


@contextlib.contextmanager
def head_on(model: torch.nn.Module, head: RolloutHead, train_head: bool = False):
    """Inside the block, ``model``'s logits are ``W_lm h + f_phi(h)`` (a forward hook on ``lm_head``,
    so the package's decoders, lean or ``transformers``, sample from ``pi_{theta,phi}`` unchanged).
    With ``train_head`` the LM's part is detached: a gradient reaches the head only. The hook is
    removed on leaving, even after an error: outside the block the model is the inference policy."""
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to add the rollout head to")

    def hook(module, inputs, out):
        h = inputs[0]
        if train_head:
            out, h = out.detach(), h.detach()
        return out + head(h).to(out.dtype)

    handle = lm_head.register_forward_hook(hook)
    try:
        yield model
    finally:
        handle.remove()


# ---------------------------------------------------------------------- the pure functions
def head_log_ratio(logits: torch.Tensor, delta: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log pi_theta(y) - log pi_{theta,phi}(y) = -delta_y + log sum_v pi_theta(v) exp(delta_v)``, the
    log of the corrected weight, from the two logit vectors (tempered: ``logits = z / T``,
    ``delta = f / T``).

    ====== ============ ====================================
    logits ``(..., V)`` inference logits
    delta  ``(..., V)`` the head's residual
    tokens ``(...,)``   long, the drawn tokens
    return ``(...,)``   float64 log ratio
    ====== ============ ====================================
    """
    check_same_shape(logits=logits, delta=delta)
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens {tuple(tokens.shape)} do not match logits {tuple(logits.shape)}")
    logp = torch.log_softmax(logits.double(), -1)
    d = delta.double()
    return -d.gather(-1, tokens[..., None]).squeeze(-1) + torch.logsumexp(logp + d, -1)


def head_kl(logits: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Exact ``KL(pi_{theta,phi} || pi_theta)`` per position, ``(..., V) -> (...,)``; for a small head
    it is ``Var_{pi_theta}(delta) / 2`` to second order."""
    check_same_shape(logits=logits, delta=delta)
    lq = torch.log_softmax(logits.float() + delta.float(), -1)
    lp = torch.log_softmax(logits.float(), -1)
    return (lq.exp() * (lq - lp)).sum(-1)


def rarity_advantages(scores: torch.Tensor, index: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The authors' rarity advantage, per group: ``a_i = 1 / c(r_i)`` (``c`` = rows of the group with
    the same reward value), then ``(a_i - mean) / (std + eps)`` (``std`` unbiased, as
    ``torch.std``); 0 for a group whose ``a`` are all equal.

    ======  ======  ==================================
    scores  (B,)    rewards
    index   (B,)    group id of each row
    return  (B,)    float32 rarity advantages
    ======  ======  ==================================
    """
    scores, index = torch.as_tensor(scores).reshape(-1).double(), torch.as_tensor(index).reshape(-1)
    if scores.shape != index.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and index {tuple(index.shape)} differ")
    if not torch.isfinite(scores).all():
        raise ValueError("rarity_advantages: scores must be finite")
    out = torch.zeros_like(scores)
    for g in torch.unique(index):
        rows = (index == g).nonzero().squeeze(-1)
        if len(rows) < 2:
            raise ValueError(f"group {int(g)} has {len(rows)} row; the rarity advantage needs G >= 2")
        r = scores[rows]
        a = 1.0 / (r[:, None] == r[None, :]).sum(1).double()
        centred = a - a.mean()
        out[rows] = centred if bool((centred == 0).all()) else centred / (a.std() + eps)
    return out.float()


def expected_distinct(p: np.ndarray, G: int) -> float:
    """``E[K] = sum_v 1 - (1 - p_v)^G``: expected number of distinct outcomes among ``G`` draws from
    ``p`` (which is ``G`` times the expected group-mean raw rarity ``1 / c``)."""
    p = np.asarray(p, float)
    if p.ndim != 1 or (p < 0).any() or not np.isclose(p.sum(), 1.0):
        raise ValueError("p must be a probability vector")
    return float((1 - (1 - p) ** G).sum())


# ---------------------------------------------------------------------- closed form: a bandit
def bandit_gradients(theta: np.ndarray, f: np.ndarray, r: np.ndarray) -> dict:
    """Exact expected policy-gradient directions for a softmax bandit ``pi = softmax(theta)`` whose
    samples come from ``mu = softmax(theta + f)``, with the group-mean baseline ``b = E_mu[r]``:

    * ``true``: ``grad J``, ``J = E_pi[r]``;
    * ``corrected``: ``E_mu[(pi/mu) (r - b) grad log pi]`` (equal to ``true`` for any constant ``b``);
    * ``uncorrected``: ``E_mu[(r - b) grad log pi]`` (the released update, ratio 1 at ``theta_old``).

    Also ``J``, ``b`` and ``ascent`` (``<uncorrected, true>``; negative: the update lowers ``J``).
    """
    theta, f, r = (np.asarray(x, float) for x in (theta, f, r))
    if not theta.shape == f.shape == r.shape or theta.ndim != 1:
        raise ValueError("theta, f and r must be 1-D of one shape")
    pi = np.exp(theta - theta.max()); pi /= pi.sum()
    mu = np.exp(theta + f - (theta + f).max()); mu /= mu.sum()
    J, b = float(pi @ r), float(mu @ r)
    score = np.eye(len(pi)) - pi[None, :]  # row y: grad_theta log pi(y)
    true = pi * (r - J)
    corrected = ((mu * (pi / mu) * (r - b))[:, None] * score).sum(0)
    uncorrected = ((mu * (r - b))[:, None] * score).sum(0)
    return {"pi": pi, "mu": mu, "J": J, "b": b, "true": true, "corrected": corrected, "uncorrected": uncorrected,
            "ascent": float(uncorrected @ true)}


# ---------------------------------------------------------------------- the registered loss
# the corrected ratio pi_old / mu: the shared behaviour-IS loss, registered under the chapter's name too
compute_r2po_loss = register_policy_loss("r2po")(compute_behaviour_is_loss)


# ---------------------------------------------------------------------- the reward
@register_reward("r2po_format")
def format_reward(batch, examples, task, state) -> torch.Tensor:
    """The authors' reward: correctness ``+1 / -1`` plus format ``+1.25 / -1`` (a completion is
    malformed when the task's verifier says so: its reason starts with ``"malformed"``). Values:
    2.25 correct, 0.25 well-formed but wrong, -2 malformed."""
    if len(batch.texts) != len(examples):
        raise ValueError(f"{len(batch.texts)} completions but {len(examples)} examples")
    out = []
    for text, ex in zip(batch.texts, examples):
        s = task.score(text, ex)
        ok, bad = s.reward == 1.0, s.reason.startswith("malformed")
        out.append((1.0 if ok else -1.0) + (-1.0 if bad else 1.25))
    return torch.tensor(out, dtype=torch.float32)


# ---------------------------------------------------------------------- the registered sampler
def new_head_state(model, width: int | None, init: str, lr: float, seed: int) -> dict:
    """``state["r2po"]`` at the start: the head's weights, its AdamW state and counters (plain
    tensors and dicts, so a checkpoint's ``torch.save`` restores them exactly)."""
    cfg = model.config
    head = RolloutHead(cfg.hidden_size, model.get_output_embeddings().weight.shape[0], width, init, seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    return {"head": head.state_dict(), "optimizer": opt.state_dict(), "updates": 0,
            "shape": (cfg.hidden_size, head.layer2.out_features, head.layer1.out_features)}


def head_from_state(st: dict, lr: float | None = None) -> tuple[RolloutHead, torch.optim.AdamW]:
    """Rebuild the head and its optimiser from ``state["r2po"]``."""
    hidden, vocab, width = st["shape"]
    head = RolloutHead(hidden, vocab, width)
    head.load_state_dict(st["head"])
    opt = torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=0.0)
    opt.load_state_dict(st["optimizer"])
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    return head, opt


def _draw(model, tokenizer, head, prompts, config, generator):
    from ..lm.sampling import sample

    with head_on(model, head):
        return sample(model, tokenizer, prompts, num_generations=config.num_generations,
                      max_new_tokens=config.max_completion_length, temperature=config.temperature,
                      generator=generator)


def head_update(model, head, opt, batch, advantages, beta: float) -> dict:
    """One step of the head's objective on ``batch`` (drawn with the head on), the LM frozen:
    ``-agg(A_rar * log pi_{theta,phi}(y_t)) + beta * agg(KL(pi_{theta,phi} || pi_theta))`` with the
    token-mean over the batch (one pass, so the clipped ratio is 1). Returns its metrics."""
    from ..lm.model import position_ids_from_mask

    T, mask = batch.response_len, batch.response_mask
    ids, attn = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn), use_cache=False,
                    logits_to_keep=T + 1, output_hidden_states=True)
    h = out.hidden_states[-1][:, -T - 1:-1]  # (B,T,d) after the final norm (what lm_head reads)
    z = out.logits[:, :-1].float() / batch.temperature
    delta = head(h).float() / batch.temperature
    logq = torch.log_softmax(z + delta, -1)
    tok_logq = logq.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    kl = (logq.exp() * (logq - torch.log_softmax(z, -1))).sum(-1)
    pg = -(advantages[:, None] * tok_logq)
    loss = masked_mean(pg + beta * kl, mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    opt.step()
    return {"r2po_head_loss": float(loss.detach()), "r2po_head_kl": float(masked_mean(kl.detach(), mask))}


def answers_of(texts) -> list[str]:
    """The final answer of each completion: the text after its last ``|`` (the addition format),
    else the whole stripped text."""
    return [t.rsplit("|", 1)[1].strip() if "|" in t else t.strip() for t in texts]


def distinct_per_group(texts, index: torch.Tensor) -> float:
    """Mean over groups of the number of distinct final answers (:func:`answers_of`)."""
    answers = answers_of(texts)
    groups = torch.unique(index).tolist()
    return float(np.mean([distinct_count([answers[i] for i in (index == g).nonzero().squeeze(-1).tolist()])
                          for g in groups]))


@register_sampler("r2po")
def r2po_sampler(model, tokenizer, prompts, config, generator, state, examples, task, reward, step,
                 head_lr: float = 1e-3, head_every: int = 1, head_steps: int = 1, head_beta: float = 0.04,
                 head_width: int | None = None, head_init: str = "zero_last", head_seed: int = 0):
    """Training rollouts from ``pi_{theta,phi}`` (the policy plus its residual rollout head).

    Stages (the authors alternate them): at steps ``1, 1 + head_every, ...`` the head first takes
    ``head_steps`` updates (:func:`head_update`, rarity advantages of the loop's ``reward``, LM
    frozen), each on a fresh draw for the step's prompts; then the step's batch is drawn with the
    head on and handed to the loop, whose update trains the LM (the head frozen).
    ``head_every=0`` never trains the head (it stays ``f = 0``: the plain policy).

    The returned batch: ``logprobs`` and ``entropy`` are the inference policy's (head off),
    ``extras["behaviour_logprob"]`` ``(B,T)`` holds ``log pi_{theta,phi}(y_t)`` (0 where masked), and
    ``metrics`` report ``r2po_kl`` (mean ``log mu - log pi`` over the batch's tokens, a sampled
    estimate of KL(pi_{theta,phi} || pi_theta)),
    ``r2po_distinct`` (distinct answers per group), ``r2po_log_w`` (mean token ``log pi/mu``) and,
    on head steps, ``r2po_head_loss`` and ``r2po_head_kl`` (the exact KL on the head's batch). The head and its optimiser live in ``state["r2po"]``.
    """
    from ..lm.model import response_logprobs

    if config.top_k or config.top_p != 1.0:
        raise ValueError("the r2po sampler needs top_k=0 and top_p=1 (its behaviour log-probs are unfiltered)")
    if config.temperature <= 0:
        raise ValueError("the r2po sampler samples: it needs temperature > 0")
    if head_every < 0 or head_steps < 0 or head_beta < 0 or head_lr < 0:
        raise ValueError("head_every, head_steps, head_beta and head_lr must be >= 0")
    if config.num_generations < 2 and head_every and head_steps:
        raise ValueError("training the rollout head needs num_generations >= 2 (its rarity advantage is per group)")
    if "r2po" not in state:
        state["r2po"] = new_head_state(model, head_width, head_init, head_lr, head_seed)
    st = state["r2po"]
    head, opt = head_from_state(st, head_lr)
    metrics: dict[str, float] = {}
    if head_every and head_steps and (step - 1) % head_every == 0:
        for _ in range(head_steps):
            hb = _draw(model, tokenizer, head, prompts, config, generator)
            per_row = [examples[int(i)] for i in hb.index]
            scores = torch.as_tensor(reward(hb, per_row, task, state), dtype=torch.float32).reshape(-1)
            metrics.update(head_update(model, head, opt, hb, rarity_advantages(scores, hb.index), head_beta))
            st["updates"] += 1
    st["head"], st["optimizer"] = head.state_dict(), opt.state_dict()
    batch = _draw(model, tokenizer, head, prompts, config, generator)
    mask, T = batch.response_mask, batch.response_len
    with torch.no_grad():
        logp, ent = response_logprobs(model, batch.input_ids, batch.attention_mask, T, batch.temperature,
                                      return_entropy=True)
    behaviour = batch.logprobs
    log_w = (logp - behaviour) * mask
    metrics.update(r2po_kl=float(masked_mean(-log_w, mask)) if mask.sum() else 0.0,
                   r2po_log_w=float(masked_mean(log_w, mask)) if mask.sum() else 0.0,
                   r2po_distinct=distinct_per_group(batch.texts, batch.index), r2po_head_updates=float(st["updates"]))
    return replace(batch, logprobs=logp * mask, entropy=ent * mask,
                   extras={**batch.extras, "behaviour_logprob": behaviour}, metrics={**batch.metrics, **metrics})
