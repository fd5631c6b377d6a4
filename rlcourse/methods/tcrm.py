"""TCRM: a reward model trained to be a value function, and that model as PPO's critic.

Course material for *Reward Models Are Secretly Value Functions: Temporally Coherent Reward
Modeling*, Alex Nikulkov (2026), arXiv:2604.22981. The abstract gives the idea (two regularisers on
top of Bradley-Terry whose minimisers are conditional expectations, one Monte-Carlo and one TD); the
loss forms, the weights and the stop-gradient placement here are the course's **reconstruction**.

A reward model outputs a scalar after every token, :math:`v_\\phi(h_t)` with :math:`h_t = (x, y_{\\le t})`
for :math:`t = 0..T` (``h_0`` is the prompt alone, ``h_T`` ends with EOS); its score is
:math:`v_\\phi(h_T)`. Values live in a ``(B, T+1)`` tensor aligned so that column 0 is the last prompt
token and column ``j`` the ``j``-th response token; ``mask`` is 1 on a prefix of each row (column 0
always) and the last 1 is the row's final position.

=============================  ===============================================================
:class:`DyckWalk`              task ``dyck_walk``: continue a 0/1 walk to 16 steps, never below 0
:func:`walk_values`            exact value of a walk prefix under the data policy (a fair coin)
:func:`mc_loss`                lookahead consistency: every position towards sg[final]
:func:`td_loss`                smoothness: every position towards sg[next]
:func:`tcrm_loss`              Bradley-Terry on the final positions + lam_mc * MC + lam_td * TD
reward-model loss ``tcrm``     :func:`tcrm_pair_loss`, for :func:`rlcourse.supervised.train_reward_model`
reward ``tcrm_score``          the named reward model's final score (its forward is kept)
estimator ``tcrm_gae``         GAE with the same model's values as the critic (no critic trained)
=============================  ===============================================================

The chapter's experiments (the tabular check, reward models on walk pairs and their metrics, PPO with a
separate or a unified critic) are in :mod:`rlcourse.studies.tcrm`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np
import torch

from ..advantages import compute_gae_advantage_return, register_estimator
from ..lm.heads import ScalarHeadModel
from ..lm.zoo import sft_batch
from ..losses import bradley_terry_loss
from ..ops import check_finite, check_same_shape
from ..rewards import register_reward
from ..supervised import register_reward_model_loss
from ..tasks import Example, Score, Task, register_task

PAPER = ("Reward Models Are Secretly Value Functions: Temporally Coherent Reward Modeling, "
         "Nikulkov, 2026, arXiv:2604.22981")

WALK_LENGTH = 16  # steps of a whole walk (prefix in the prompt + response)
MAX_PREFIX = 6  # the prompt gives up to this many first steps
MAX_START = 2  # starting heights 0..MAX_START


# ---------------------------------------------------------------------------------------- the walk
def survival_counts(max_height: int, max_steps: int) -> np.ndarray:
    """``counts[h, r]``: continuations of ``r`` steps (+1 or -1) from height ``h`` that never go
    below 0 (exact integers; ``counts[h, 0] = 1``)."""
    c = np.zeros((max_height + max_steps + 2, max_steps + 1), dtype=np.float64)
    c[:, 0] = 1.0
    for r in range(1, max_steps + 1):
        c[:-1, r] = c[1:, r - 1]
        c[1:, r] += c[:-1, r - 1]
    return c[:max_height + 1]


_COUNTS = survival_counts(MAX_START + WALK_LENGTH + 1, WALK_LENGTH)


def survival_value(height: int, steps_left: int) -> float:
    """:math:`P(\\text{a fair-coin walk of } r \\text{ more steps from } h \\text{ never goes below } 0)`."""
    if height < 0:
        return 0.0
    return float(_COUNTS[height, steps_left] / 2.0 ** steps_left)


def parse_prompt(prompt: str) -> tuple[int, str]:
    """``"walk 1:0110>"`` -> (start height 1, prefix ``"0110"``); a ValueError for anything else."""
    m = re.fullmatch(r"walk (\d+):([01]*)>", prompt)
    if m is None:
        raise ValueError(f"not a dyck_walk prompt: {prompt!r}")
    return int(m.group(1)), m.group(2)


def heights(start: int, steps: str) -> np.ndarray:
    """Running heights after each step of a 0/1 string ('1' up, '0' down), ``(len(steps),)``."""
    return start + np.cumsum([1 if s == "1" else -1 for s in steps]).astype(int) if steps else np.zeros(0, int)


def first_dip(start: int, steps: str) -> int | None:
    """1-based index of the first step that takes the walk below 0, or None."""
    below = np.nonzero(heights(start, steps) < 0)[0]
    return int(below[0]) + 1 if len(below) else None


class DyckWalk(Task):
    """``walk h:p>`` -> ``s``: start at height ``h``, take the prefix steps ``p`` (given), then write
    ``16 - len(p)`` more steps (``1`` up, ``0`` down). Reward 1 if the whole walk never goes below 0.
    A completion of the wrong length or with other characters scores 0 ("malformed"). The
    demonstration is a uniformly random valid continuation; ``meta['walk_prefix']`` holds ``(h, p)``."""

    name = "dyck_walk"

    def _draw(self, rng):
        h, k = int(rng.integers(0, MAX_START + 1)), int(rng.integers(0, MAX_PREFIX + 1))
        while True:  # a uniform valid prefix of length k
            prefix = "".join(rng.choice(["0", "1"], size=k))
            if first_dip(h, prefix) is None:
                break
        r = WALK_LENGTH - k
        height, sol = (int(heights(h, prefix)[-1]) if k else h), []
        for left in range(r, 0, -1):  # uniform among valid continuations (count-weighted)
            up = _COUNTS[height + 1, left - 1]
            down = _COUNTS[height - 1, left - 1] if height >= 1 else 0.0
            step = "1" if rng.random() < up / (up + down) else "0"
            height += 1 if step == "1" else -1
            sol.append(step)
        return Example(f"walk {h}:{prefix}>", str(r), "".join(sol), meta={"walk_prefix": (h, prefix)})

    def score(self, completion, example):
        h, prefix = parse_prompt(example.prompt)
        r = WALK_LENGTH - len(prefix)
        text = completion.strip()
        if not re.fullmatch(r"[01]*", text) or len(text) != r:
            return Score(0.0, f"malformed: expected {r} steps written as 0/1")
        t = first_dip(h, prefix + text)
        return Score(0.0, f"goes below zero at step {t}") if t is not None else Score(1.0, "stays non-negative")


register_task("dyck_walk")(DyckWalk)


def walk_values(prompt: str, response: str, n_positions: int | None = None) -> np.ndarray:
    """Exact value :math:`V^\\mu(h_j)` of each prefix of a response under the data policy :math:`\\mu`
    (a fair coin for each remaining step, then EOS), the target of TCRM's regularisers.

    ============ ============ =====================================================
    prompt       str          a ``dyck_walk`` prompt
    response     str          the response text (EOS not included)
    n_positions  int          length of the output (default ``len(response) + 2``)
    return       ``(n,)``     column 0: after the prompt; column j: after response token
                              j (the EOS column repeats the last); 0 once the walk went
                              below 0 or the text stopped being a well-formed walk
    ============ ============ =====================================================
    """
    h, prefix = parse_prompt(prompt)
    r = WALK_LENGTH - len(prefix)
    n = len(response) + 2 if n_positions is None else n_positions
    out = np.zeros(n)
    height = int(heights(h, prefix)[-1]) if prefix else h
    out[0] = survival_value(height, r)
    alive = True
    for j in range(1, n):
        if j <= len(response):
            ch = response[j - 1]
            if ch not in "01" or j > r:
                alive = False
            else:
                height += 1 if ch == "1" else -1
                alive = alive and height >= 0
            out[j] = survival_value(height, r - j) if alive else 0.0
        else:  # EOS and padding: the walk is over
            out[j] = out[j - 1] if (alive and len(response) == r) else 0.0
    return out


# ---------------------------------------------------------------------------------------- losses
def _check_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    check_same_shape(values=values, mask=mask)
    if values.ndim != 2 or values.shape[1] < 2:
        raise ValueError(f"values must be (B, T+1) with T >= 1, got {tuple(values.shape)}")
    m = mask.to(values.dtype)
    if not torch.all((m == 0) | (m == 1)) or not torch.all(m[:, 0] == 1):
        raise ValueError("mask must be 0/1 with column 0 (the prompt's last position) set in every row")
    if torch.any(m[:, 1:] > m[:, :-1]):
        raise ValueError("mask must be 1 on a prefix of each row (right padding only)")
    if torch.any(m.sum(1) < 2):
        raise ValueError("every row needs at least one response position after the prompt")
    check_finite("values", values.detach())
    return m


def final_index(mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` column of each row's final position (the last 1 of ``mask``)."""
    return mask.long().sum(1) - 1


def final_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` the score :math:`v(h_T)` of each row (its value at the final position)."""
    _check_values(values, mask)
    return values.gather(1, final_index(mask)[:, None]).squeeze(1)


def mc_loss(values: torch.Tensor, mask: torch.Tensor, detach_target: bool = True) -> torch.Tensor:
    """Monte-Carlo (lookahead-consistency) regulariser: each earlier position regresses on the row's
    own final score, :math:`\\frac1{n}\\sum_{j<n}(v_j - \\operatorname{sg}[v_n])^2` for a row whose
    final column is ``n``, averaged over rows.

    ============= =========== ===========================================
    values        ``(B,T+1)`` v(h_0) .. v(h_T) (column 0: the prompt)
    mask          ``(B,T+1)`` 1 on a prefix of each row; last 1 = final
    detach_target bool        stop the gradient through the target (the
                              reconstruction's placement); False for the
                              full derivative
    return        scalar
    ============= =========== ===========================================
    """
    m = _check_values(values, mask)
    fin = final_index(mask)
    target = values.gather(1, fin[:, None])
    target = target.detach() if detach_target else target
    cols = torch.arange(values.shape[1], device=values.device)[None, :]
    before = (cols < fin[:, None]).to(values.dtype) * m
    per_row = ((values - target) ** 2 * before).sum(1) / before.sum(1)
    return per_row.mean()


def td_loss(values: torch.Tensor, mask: torch.Tensor, detach_target: bool = True) -> torch.Tensor:
    """TD (smoothness) regulariser: each position regresses on the next,
    :math:`\\frac1{n}\\sum_{j<n}(v_j - \\operatorname{sg}[v_{j+1}])^2`, averaged over rows (shapes as
    :func:`mc_loss`)."""
    m = _check_values(values, mask)
    target = values[:, 1:].detach() if detach_target else values[:, 1:]
    pair = m[:, 1:]  # position j counts when j+1 is still in the row
    per_row = ((values[:, :-1] - target) ** 2 * pair).sum(1) / pair.sum(1)
    return per_row.mean()


def tcrm_loss(v_pos, m_pos, v_neg, m_neg, lam_mc: float = 1.0, lam_td: float = 1.0,
              detach_target: bool = True) -> tuple[torch.Tensor, dict]:
    """:math:`\\mathcal L_{BT} + \\lambda_{MC}\\mathcal L_{MC} + \\lambda_{TD}\\mathcal L_{TD}`, with
    :math:`\\mathcal L_{BT} = -\\log\\sigma(v(h^+_T) - v(h^-_T))` (:func:`rlcourse.losses.bradley_terry_loss`
    on the final positions' scores); the regularisers average over the preferred and the dispreferred
    rows alike. ``lam_mc = lam_td = 0`` is plain BT.

    ======== ============ ==========================================
    v_pos    ``(N,T+1)``  values of the preferred responses
    m_pos    ``(N,T+1)``  their masks (column 0 = prompt)
    v_neg    ``(N,T'+1)`` values of the dispreferred responses
    m_neg    ``(N,T'+1)`` their masks
    returns               ``(loss, {"bt", "mc", "td"})``: scalar, floats
    ======== ============ ==========================================
    """
    if lam_mc < 0 or lam_td < 0:
        raise ValueError(f"lam_mc and lam_td must be >= 0, got {lam_mc}, {lam_td}")
    final_pos, final_neg = final_values(v_pos, m_pos), final_values(v_neg, m_neg)
    if final_pos.shape != final_neg.shape:
        raise ValueError(f"{final_pos.shape[0]} preferred rows but {final_neg.shape[0]} dispreferred rows")
    bt = bradley_terry_loss(final_pos, final_neg)
    mc = 0.5 * (mc_loss(v_pos, m_pos, detach_target) + mc_loss(v_neg, m_neg, detach_target))
    td = 0.5 * (td_loss(v_pos, m_pos, detach_target) + td_loss(v_neg, m_neg, detach_target))
    loss = bt + lam_mc * mc + lam_td * td
    return loss, {"bt": bt.item(), "mc": mc.item(), "td": td.item()}


# ---------------------------------------------------------------------------------------- training the reward model
def encode_walks(tokenizer, examples: Sequence[Example], walks: Sequence[str]):
    """``(input_ids, attention_mask, mask)``: prompt + walk + EOS in the rollout layout, and the
    ``(B, T+1)`` mask of the value columns (column 0 = the prompt's last token)."""
    ids, att, resp = sft_batch(tokenizer, [dataclasses.replace(e, solution=w) for e, w in zip(examples, walks)])
    return ids, att, torch.cat([torch.ones(len(walks), 1), resp], 1)


def token_values(model: ScalarHeadModel, input_ids, attention_mask, response_len: int) -> torch.Tensor:
    """``(B, T+1)`` scalars after the prompt and after each response token (the scalar at the
    prompt's last position and at the ``T`` response positions)."""
    return model(input_ids, attention_mask)[:, -response_len - 1:]


@register_reward_model_loss("tcrm")
def tcrm_pair_loss(reward_model: ScalarHeadModel, tokenizer, pairs: Sequence[tuple], lam_mc: float = 1.0,
                   lam_td: float = 1.0, detach_target: bool = True) -> tuple[torch.Tensor, dict]:
    """:func:`tcrm_loss` on a minibatch of preference pairs, both responses of a pair encoded after the
    example's prompt and valued at every position (one forward pass for the minibatch);
    ``train_reward_model(..., loss="tcrm")`` trains with it.

    ======= ========== ================================================================
    pairs   N tuples   ``(example, preferred response, dispreferred response)``
    returns            ``(loss, {"bt", "mc", "td"})``: a scalar and :func:`tcrm_loss`'s parts
    ======= ========== ================================================================
    """
    exs = [p[0] for p in pairs]
    ids, att, m = encode_walks(tokenizer, exs + exs, [p[1] for p in pairs] + [p[2] for p in pairs])
    v = token_values(reward_model, ids, att, m.shape[1] - 1)
    n = len(pairs)
    return tcrm_loss(v[:n], m[:n], v[n:], m[n:], lam_mc, lam_td, detach_target)


# ---------------------------------------------------------------------------------------- loop parts
REWARD_MODELS: dict[str, ScalarHeadModel] = {}


def use_reward_model(name: str, model: ScalarHeadModel) -> str:
    """Make ``model`` available to the ``tcrm_score`` reward and the ``tcrm_gae`` estimator under
    ``name`` (an nn.Module cannot travel in ``RLConfig``'s kwargs, which are deep-copied); returns
    the name. ``"oracle"`` is reserved for the exact value function of ``dyck_walk``."""
    if name == "oracle":
        raise ValueError("'oracle' is the exact dyck_walk value function; choose another name")
    if not isinstance(model, ScalarHeadModel):
        raise TypeError(f"a TCRM reward model must be a ScalarHeadModel, got {type(model).__name__}")
    model.eval().requires_grad_(False)
    REWARD_MODELS[name] = model
    return name


def _oracle_columns(batch, examples) -> torch.Tensor:
    bad = sorted({e.prompt for e in examples if "walk_prefix" not in e.meta})
    if bad:
        raise ValueError(f"the 'oracle' value function needs dyck_walk prompts (meta['walk_prefix']); got {bad[:3]}")
    T = batch.response_ids.shape[1]
    return torch.tensor(np.stack([walk_values(e.prompt, t, T + 1) for e, t in zip(examples, batch.texts)]),
                        dtype=torch.float32)


def batch_token_values(batch, examples, reward_model: str, state: dict | None = None) -> torch.Tensor:
    """``(B, T+1)`` values of a rollout batch under the named reward model (one forward pass, kept in
    ``state["tcrm_forward"]`` so that the reward and the estimator of one step share it)."""
    if state is not None:
        kept = state.get("tcrm_forward")
        if kept is not None and kept["name"] == reward_model and kept["ids"].shape == batch.input_ids.shape \
                and torch.equal(kept["ids"], batch.input_ids):
            return kept["values"]
    if reward_model == "oracle":
        values = _oracle_columns(batch, examples)
    else:
        if reward_model not in REWARD_MODELS:
            raise ValueError(f"unknown TCRM reward model {reward_model!r}; registered: {sorted(REWARD_MODELS)} "
                             "and 'oracle' (use_reward_model(name, model) registers one)")
        with torch.no_grad():
            values = token_values(REWARD_MODELS[reward_model], batch.input_ids, batch.attention_mask,
                                  batch.response_ids.shape[1]).float()
    if state is not None:
        state["tcrm_forward"] = {"name": reward_model, "ids": batch.input_ids, "values": values}
    return values


@register_reward("tcrm_score")
def tcrm_score(batch, examples, task, state, reward_model: str = "oracle") -> torch.Tensor:
    """The named reward model's score :math:`v(h_T)` of each row (at its EOS, or its last token when
    truncated); ``"oracle"`` (the default) is the exact value, i.e. the ``dyck_walk`` verifier."""
    if reward_model == "oracle" and task.name != "dyck_walk":
        raise ValueError(f"the 'oracle' reward model scores dyck_walk only, not {task.name!r}")
    values = batch_token_values(batch, examples, reward_model, state)
    mask = torch.cat([torch.ones(len(values), 1), batch.response_mask.float().cpu()], 1)
    return final_values(values, mask)


@register_estimator("tcrm_gae")
def tcrm_gae(token_level_rewards, response_mask, batch, examples, state, gamma: float = 1.0, lam: float = 1.0,
             reward_model: str = "oracle"):
    """GAE whose critic is the reward model itself: :math:`V(s_t) = v_\\phi(h_{t-1})`, read from the
    same forward pass as the reward (no critic is trained, none is held).

    =================== ========= ==========================================
    token_level_rewards ``(B,T)`` outcome (e.g. ``tcrm_score``) on the last token
    response_mask       ``(B,T)`` 1 up to and including EOS
    returns                       ``(adv, ret)``, both ``(B,T)``
    =================== ========= ==========================================

    With ``r_T = v(h_T)``, ``gamma = 1`` and ``lam = 1``, the advantage of token ``t`` is
    ``v(h_T) - v(h_{t-1})``; with ``lam = 0`` it is the shaped reward ``v(h_t) - v(h_{t-1})``."""
    values = batch_token_values(batch, examples, reward_model, state)[:, :-1].to(token_level_rewards.dtype)
    check_same_shape(values=values, response_mask=response_mask)
    return compute_gae_advantage_return(token_level_rewards, values * response_mask, response_mask, gamma, lam)
