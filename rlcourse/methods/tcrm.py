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
:func:`bt_final_loss`          Bradley-Terry on the final positions
:func:`mc_loss`                lookahead consistency: every position towards sg[final]
:func:`td_loss`                smoothness: every position towards sg[next]
:func:`tcrm_loss`              BT + lam_mc * MC + lam_td * TD, and its parts
:func:`train_tcrm`             fit a :class:`~rlcourse.lm.heads.ScalarHeadModel` on walk pairs
:func:`middle_token_accuracy`  pairwise accuracy of the scores after half the response
:func:`first_error_f1`         ProcessBench-style F1 of "first step whose value drops below tau"
reward ``tcrm_score``          the named reward model's final score (its forward is kept)
estimator ``tcrm_gae``         GAE with the same model's values as the critic (no critic trained)
=============================  ===============================================================
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..advantages import compute_gae_advantage_return, register_estimator
from ..lm.heads import ScalarHeadModel
from ..lm.model import build_model
from ..lm.zoo import sft_batch
from ..ops import check_finite, check_same_shape
from ..lm.tokenizer import build_tokenizer  # noqa: F401  (re-exported: callers build the walk tokenizer from here)
from ..profiles import Profile
from ..rewards import register_reward
from ..tasks import Example, Score, Task, _in_test_split, register_task

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


def all_prompts() -> list[Example]:
    """Every ``dyck_walk`` prompt (start height, valid prefix) as an example without demonstration."""
    out = []
    for h in range(MAX_START + 1):
        for k in range(MAX_PREFIX + 1):
            for bits in range(2 ** k):
                prefix = format(bits, f"0{k}b") if k else ""
                if first_dip(h, prefix) is None:
                    out.append(Example(f"walk {h}:{prefix}>", str(WALK_LENGTH - k), "",
                                       meta={"walk_prefix": (h, prefix)}))
    return out


def test_prompts() -> list[Example]:
    """The held-out ``dyck_walk`` prompts (the task's test split)."""
    return [e for e in all_prompts() if _in_test_split(e.prompt, DyckWalk.test_fraction)]


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


def sample_walks(prompts: Sequence[str], rng: np.random.Generator) -> list[str]:
    """One response per prompt from the data policy :math:`\\mu`: a fair coin for each remaining step."""
    out = []
    for p in prompts:
        _, prefix = parse_prompt(p)
        out.append("".join(rng.choice(["0", "1"], size=WALK_LENGTH - len(prefix))))
    return out


def walk_pairs(examples: Sequence[Example], n: int, rng: np.random.Generator, tries: int = 64) -> list[tuple]:
    """``n`` preference pairs ``(example, valid walk, invalid walk)`` from the data policy, each on a
    prompt drawn from ``examples``: two coin walks until one is valid and one is not."""
    task, out = DyckWalk(), []
    while len(out) < n:
        ex = examples[int(rng.integers(len(examples)))]
        good = bad = None
        for _ in range(tries):
            w = sample_walks([ex.prompt], rng)[0]
            if task.score(w, ex).reward == 1.0:
                good = good or w
            else:
                bad = bad or w
            if good and bad:
                out.append((ex, good, bad))
                break
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


def bt_final_loss(v_pos, m_pos, v_neg, m_neg) -> torch.Tensor:
    """Bradley-Terry on the final positions, :math:`-\\log\\sigma(v(h^+_T) - v(h^-_T))`, mean over pairs.

    ======== ============ ==========================================
    v_pos    ``(N,T+1)``  values of the preferred responses
    m_pos    ``(N,T+1)``  their masks (column 0 = prompt)
    v_neg    ``(N,T'+1)`` values of the dispreferred responses
    m_neg    ``(N,T'+1)`` their masks
    return   scalar
    ======== ============ ==========================================
    """
    a, b = final_values(v_pos, m_pos), final_values(v_neg, m_neg)
    if a.shape != b.shape:
        raise ValueError(f"{a.shape[0]} preferred rows but {b.shape[0]} dispreferred rows")
    return -F.logsigmoid(a - b).mean()


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
    """:math:`\\mathcal L_{BT} + \\lambda_{MC}\\mathcal L_{MC} + \\lambda_{TD}\\mathcal L_{TD}`; the
    regularisers average over the preferred and the dispreferred rows alike. Shapes as
    :func:`bt_final_loss`; returns ``(loss, {"bt", "mc", "td"})``. ``lam_mc = lam_td = 0`` is plain BT."""
    if lam_mc < 0 or lam_td < 0:
        raise ValueError(f"lam_mc and lam_td must be >= 0, got {lam_mc}, {lam_td}")
    bt = bt_final_loss(v_pos, m_pos, v_neg, m_neg)
    mc = 0.5 * (mc_loss(v_pos, m_pos, detach_target) + mc_loss(v_neg, m_neg, detach_target))
    td = 0.5 * (td_loss(v_pos, m_pos, detach_target) + td_loss(v_neg, m_neg, detach_target))
    loss = bt + lam_mc * mc + lam_td * td
    return loss, {"bt": bt.item(), "mc": mc.item(), "td": td.item()}


# ---------------------------------------------------------------------------------------- tabular truth
def enumerate_sequences(vocab: int, length: int) -> np.ndarray:
    """Every sequence over ``range(vocab)`` of ``length`` tokens, ``(vocab**length, length)``."""
    return np.array(np.meshgrid(*[np.arange(vocab)] * length, indexing="ij")).reshape(length, -1).T


def markov_probs(seqs: np.ndarray, init: np.ndarray, trans: np.ndarray) -> np.ndarray:
    """Probability of each sequence under a Markov chain (``init (V,)``, ``trans (V,V)``)."""
    p = init[seqs[:, 0]].copy()
    for t in range(1, seqs.shape[1]):
        p *= trans[seqs[:, t - 1], seqs[:, t]]
    return p


def conditional_expectations(seqs: np.ndarray, probs: np.ndarray, reward: np.ndarray) -> dict:
    """Exact :math:`E[R \\mid h_t]` by enumeration for every prefix (a tuple) of length 0..T."""
    out = {}
    for t in range(seqs.shape[1] + 1):
        keys = [tuple(s[:t]) for s in seqs]
        num, den = {}, {}
        for k, p, r in zip(keys, probs, reward):
            num[k] = num.get(k, 0.0) + p * r
            den[k] = den.get(k, 0.0) + p
        out.update({k: num[k] / den[k] for k in num if den[k] > 0})
    return out


def fit_tabular(seqs: np.ndarray, probs: np.ndarray, reward: np.ndarray, kind: str, iters: int = 200) -> dict:
    """Minimise the expected MC loss (``kind="mc"``, by L-BFGS) or run semi-gradient TD to its fixed
    point (``kind="td"``, full-batch steps of step size 1 per prefix) for a table ``v`` over all
    prefixes, terminal values fixed at the rewards; returns ``{prefix: v}``."""
    if kind not in ("mc", "td"):
        raise ValueError(f"kind must be 'mc' or 'td', got {kind!r}")
    T = seqs.shape[1]
    prefixes = sorted({tuple(s[:t]) for s in seqs for t in range(T)}, key=lambda k: (len(k), k))
    idx = {k: i for i, k in enumerate(prefixes)}
    rows = np.array([[idx[tuple(s[:t])] for t in range(T)] for s in seqs])  # (N, T)
    w = torch.tensor(probs, dtype=torch.float64)
    R = torch.tensor(reward, dtype=torch.float64)
    v = torch.zeros(len(prefixes), dtype=torch.float64, requires_grad=True)
    rows_t = torch.tensor(rows)
    if kind == "mc":
        opt = torch.optim.LBFGS([v], lr=1.0, max_iter=iters, tolerance_grad=1e-14, tolerance_change=1e-16,
                                line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = (w[:, None] * (v[rows_t] - R[:, None]) ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
    else:
        mass = torch.zeros(len(prefixes), dtype=torch.float64).index_add_(0, rows_t.reshape(-1),
                                                                          w[:, None].expand(-1, T).reshape(-1))
        for _ in range(iters):
            full = torch.cat([v[rows_t], R[:, None]], 1)  # (N, T+1): v(h_0..h_{T-1}), then R
            target = full[:, 1:].detach()
            loss = 0.5 * (w[:, None] * (full[:, :-1] - target) ** 2).sum()
            grad, = torch.autograd.grad(loss, v)
            with torch.no_grad():
                v -= grad / mass  # step 1 per prefix: v(h) <- E[v(h') | h]
    values = dict(zip(prefixes, v.detach().numpy().tolist()))
    values.update({tuple(s): float(r) for s, r in zip(seqs, reward)})
    return values


# ---------------------------------------------------------------------------------------- models
def rm_sizes(prof: Profile) -> dict:
    """The reward model's and the data policy's sizes, and the experiment's budget, by profile."""
    return dict(
        hidden=32, intermediate=64, layers=prof.pick(1, 2), heads=2,
        rm_steps=prof.pick(30, 400), rm_batch=prof.pick(16, 32), rm_lr=prof.pick(3e-3, 2e-3),
        train_pairs=prof.pick(256, 4000), test_pairs=prof.pick(128, 1000), test_walks=prof.pick(128, 1000),
        seeds=prof.seeds, lam_mc=0.1, lam_td=0.1,
        policy_sft_steps=prof.pick(30, 300), ppo_steps=prof.pick(4, 40), ppo_prompts=prof.pick(4, 16),
        ppo_generations=4, ppo_eval_every=prof.pick(2, 10), ppo_eval_walks=prof.pick(64, 256),
        ppo_lr=prof.pick(1e-3, 3e-4),
    )


def tiny_lm(tokenizer, prof: Profile, seed: int):
    """A ``LlamaForCausalLM`` of :func:`rm_sizes`' width (a smaller trunk than the profile's)."""
    s = rm_sizes(prof)
    small = dataclasses.replace(prof, lm_hidden=s["hidden"], lm_intermediate=s["intermediate"],
                                lm_layers=s["layers"], lm_heads=s["heads"])
    return build_model(tokenizer, small, seed=seed)


def new_reward_model(tokenizer, prof: Profile, seed: int) -> ScalarHeadModel:
    """A fresh reward model: a tiny trunk with a zero-initialised scalar head."""
    return ScalarHeadModel.from_policy(tiny_lm(tokenizer, prof, seed))


def encode_walks(tokenizer, examples: Sequence[Example], walks: Sequence[str]):
    """``(input_ids, attention_mask, mask)``: prompt + walk + EOS in the rollout layout, and the
    ``(B, T+1)`` mask of the value columns (column 0 = the prompt's last token)."""
    ids, att, resp = sft_batch(tokenizer, [dataclasses.replace(e, solution=w) for e, w in zip(examples, walks)])
    return ids, att, torch.cat([torch.ones(len(walks), 1), resp], 1)


def token_values(model: ScalarHeadModel, input_ids, attention_mask, response_len: int) -> torch.Tensor:
    """``(B, T+1)`` scalars after the prompt and after each response token (the scalar at the
    prompt's last position and at the ``T`` response positions)."""
    return model(input_ids, attention_mask)[:, -response_len - 1:]


def walk_scores(model: ScalarHeadModel, tokenizer, examples, walks, batch: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Values ``(N, T+1)`` (float64, no gradient) and masks of walks under a reward model."""
    vals, masks = [], []
    with torch.no_grad():
        for i in range(0, len(walks), batch):
            ids, att, m = encode_walks(tokenizer, examples[i:i + batch], walks[i:i + batch])
            v = token_values(model, ids, att, m.shape[1] - 1)
            pad = WALK_LENGTH + 2 - v.shape[1]
            vals.append(F.pad(v, (0, pad)).double().numpy())
            masks.append(F.pad(m, (0, pad)).numpy())
    return np.concatenate(vals), np.concatenate(masks)


def train_tcrm(rm: ScalarHeadModel, tokenizer, pairs: Sequence[tuple], steps: int, batch_size: int = 64,
               lr: float = 1e-3, lam_mc: float = 1.0, lam_td: float = 1.0, seed: int = 0,
               detach_target: bool = True) -> list[dict]:
    """Fit a reward model on ``(example, preferred walk, dispreferred walk)`` pairs with
    :func:`tcrm_loss` (``lam_mc = lam_td = 0``: Bradley-Terry only); returns the per-step losses."""
    if not pairs:
        raise ValueError("train_tcrm needs at least one preference pair")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(rm.parameters(), lr=lr, weight_decay=0.0)
    log = []
    rm.train()
    for _ in range(steps):
        chunk = [pairs[i] for i in torch.randint(len(pairs), (min(batch_size, len(pairs)),), generator=gen).tolist()]
        exs = [c[0] for c in chunk]
        ids, att, m = encode_walks(tokenizer, exs + exs, [c[1] for c in chunk] + [c[2] for c in chunk])
        v = token_values(rm, ids, att, m.shape[1] - 1)
        n = len(chunk)
        loss, parts = tcrm_loss(v[:n], m[:n], v[n:], m[n:], lam_mc, lam_td, detach_target)
        check_finite("TCRM loss", loss.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append({"loss": loss.item(), **parts})
    rm.eval()
    return log


# ---------------------------------------------------------------------------------------- metrics
def middle_columns(examples: Sequence[Example]) -> np.ndarray:
    """The value column after half of each response's steps, ``(N,)``."""
    return np.array([(WALK_LENGTH - len(parse_prompt(e.prompt)[1])) // 2 for e in examples])


def middle_token_accuracy(v_pos: np.ndarray, v_neg: np.ndarray, cols: np.ndarray) -> float:
    """Share of pairs whose preferred response scores higher after half its steps (ties count half).

    ====== ============ =========================================
    v_pos  ``(N,T+1)``  values of the preferred walks
    v_neg  ``(N,T+1)``  values of the dispreferred walks
    cols   ``(N,)``     the middle column of each pair
    ====== ============ =========================================
    """
    a, b = v_pos[np.arange(len(cols)), cols], v_neg[np.arange(len(cols)), cols]
    return float(np.mean((a > b) + 0.5 * (a == b)))


def final_accuracy(v_pos, m_pos, v_neg, m_neg) -> float:
    """Share of pairs whose preferred response has the higher final score (ties count half)."""
    a = v_pos[np.arange(len(v_pos)), m_pos.sum(1).astype(int) - 1]
    b = v_neg[np.arange(len(v_neg)), m_neg.sum(1).astype(int) - 1]
    return float(np.mean((a > b) + 0.5 * (a == b)))


def predicted_first_error(values: np.ndarray, steps: np.ndarray, tau: float) -> np.ndarray:
    """First step ``j in 1..r`` whose value is below ``tau`` (0 = no error predicted), ``(N,)``;
    ``values (N, T+1)``, ``steps (N,)`` the number of steps of each walk."""
    cols = np.arange(values.shape[1])[None, :]
    below = (values < tau) & (cols >= 1) & (cols <= steps[:, None])
    return np.where(below.any(1), below.argmax(1), 0)


def error_f1(pred: np.ndarray, truth: np.ndarray) -> float:
    """ProcessBench's F1: harmonic mean of the exact-step accuracy on erroneous samples
    (``truth > 0``) and of the accuracy on correct ones (``truth == 0``: predicting no error)."""
    err, ok = truth > 0, truth == 0
    if not err.any() or not ok.any():
        raise ValueError("error_f1 needs both erroneous and correct samples")
    a, b = float(np.mean(pred[err] == truth[err])), float(np.mean(pred[ok] == 0))
    return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def first_error_f1(cal: tuple, test: tuple) -> tuple[float, float]:
    """F1 on ``test`` with the threshold that maximises it on ``cal``; each is ``(values (N,T+1),
    steps (N,), true first error (N,), 0 for none)``. Returns ``(F1, tau)``."""
    v, steps, truth = cal
    uniq = np.unique(v[:, 1:])
    if len(uniq) > 400:
        uniq = np.quantile(v[:, 1:], np.linspace(0, 1, 401))
    taus = np.concatenate([[uniq[0] - 1.0], (uniq[1:] + uniq[:-1]) / 2, [uniq[-1] + 1.0]])
    f1s = [error_f1(predicted_first_error(v, steps, t), truth) for t in taus]
    tau = float(taus[int(np.argmax(f1s))])
    tv, ts, tt = test
    return error_f1(predicted_first_error(tv, ts, tau), tt), tau


def value_r2(values: np.ndarray, exact: np.ndarray, steps: np.ndarray) -> float:
    """Squared correlation between a model's values and the exact values :math:`V^\\mu(h_j)` over every
    walk position ``j = 0..r`` (EOS excluded): the share of the exact value's variance that the best
    affine map of the model's values explains (BT and TCRM pin the scale only up to such a map)."""
    cols = np.arange(values.shape[1])[None, :]
    keep = cols <= steps[:, None]
    a, b = values[keep], exact[keep]
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1] ** 2)


def walk_truth(examples: Sequence[Example], walks: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, first error)`` of walks (first error counted within the response; 0 = none)."""
    steps, truth = [], []
    for e, w in zip(examples, walks):
        h, prefix = parse_prompt(e.prompt)
        t = first_dip(h, prefix + w)
        steps.append(len(w))
        truth.append(0 if t is None else t - len(prefix))
    return np.array(steps), np.array(truth)


def oracle_scores(examples, walks) -> tuple[np.ndarray, np.ndarray]:
    """The exact value function in :func:`walk_scores`' layout (the ceiling of every metric)."""
    v = np.stack([walk_values(e.prompt, w, WALK_LENGTH + 2) for e, w in zip(examples, walks)])
    m = np.zeros_like(v)
    for i, w in enumerate(walks):
        m[i, :len(w) + 2] = 1
    return v, m


def pair_target(exact: np.ndarray) -> np.ndarray:
    """The regularisers' actual target under the pair data: ``W(h) = P_pair(valid | h)``.

    A pair is one valid and one invalid walk of :math:`\\mu` on the same prompt, so each prompt's walks
    are half valid, half invalid, whatever its :math:`s = V^\\mu(h_0)`. By Bayes,
    ``W = V (1 - s) / (V (1 - s) + (1 - V) s)``: the odds of :math:`V^\\mu` times ``(1 - s) / s``. It is
    :math:`V^\\mu` only where ``s = 1/2``.

    ======= ============ ==========================================================
    exact   ``(N, T+1)`` the exact :math:`V^\\mu` along each walk (column 0: the prompt,
                         whose value is ``s``), e.g. from :func:`oracle_scores`
    return  ``(N, T+1)`` ``W`` at the same positions
    ======= ============ ==========================================================
    """
    v = np.asarray(exact, float)
    if v.ndim != 2 or np.any((v < 0) | (v > 1)):
        raise ValueError("exact must be (N, T+1) values in [0, 1]")
    s = v[:, :1]
    if np.any((s <= 0) | (s >= 1)):
        raise ValueError("a prompt with value 0 or 1 has no preference pair: s must lie in (0, 1)")
    num = v * (1 - s)
    return num / (num + (1 - v) * s)


def pair_target_scores(examples, walks) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pair_target` in :func:`walk_scores`' layout (the regularisers' own ceiling)."""
    v, m = oracle_scores(examples, walks)
    return pair_target(v), m


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


# ---------------------------------------------------------------------- the experiment, in rlcourse.studies.tcrm
_STUDY_NAMES = frozenset((
    'data_policy', 'ppo_experiment', 'rm_data', 'rm_experiment', 'score_all', 'state_bytes', 'validity',
))


def __getattr__(name):
    """The chapter's experiment lives in :mod:`rlcourse.studies.tcrm`; its names stay importable here."""
    if name in _STUDY_NAMES:
        from ..studies import tcrm as study

        return getattr(study, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
