"""TCRM's experiments: the enumerated check of the regularisers' minimisers, the data policy's walks and
preference pairs on ``dyck_walk``, the reward models' sizes, scores and metrics (middle-token accuracy,
first-error F1, value R²), BT against TCRM on walk pairs, and PPO with a separate or a unified critic
(the task, the losses and the loop parts are in :mod:`rlcourse.methods.tcrm`).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..lm.heads import ScalarHeadModel
from ..lm.model import build_model
from ..lm.sampling import sample
from ..lm.tokenizer import build_tokenizer
from ..methods.tcrm import (
    MAX_PREFIX, MAX_START, REWARD_MODELS, WALK_LENGTH, DyckWalk, encode_walks, first_dip, parse_prompt,
    token_values, use_reward_model, walk_values,
)
from ..profiles import Profile, one_torch_thread, profile as current_profile
from ..supervised import train_reward_model
from ..tasks import Example, _in_test_split
from .runner import Study, run_study


# ---------------------------------------------------------------------------------------- walks and pairs
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


# ---------------------------------------------------------------------------------------- experiment
def rm_data(prof: Profile, seed: int) -> dict:
    """Train pairs, held-out pairs, and calibration/test walks for the reward-model experiment."""
    s, task, rng = rm_sizes(prof), DyckWalk(), np.random.default_rng([2604_22981, seed])
    train_ex = task.examples(2000, seed=seed, split="train")
    test_ex = test_prompts()
    pairs = walk_pairs(train_ex, s["train_pairs"], rng)
    test_pairs = walk_pairs(test_ex, s["test_pairs"], rng)
    cal_ex = [train_ex[int(i)] for i in rng.integers(len(train_ex), size=s["test_walks"])]
    tst_ex = [test_ex[int(i)] for i in rng.integers(len(test_ex), size=s["test_walks"])]
    return dict(pairs=pairs, test_pairs=test_pairs, cal=(cal_ex, sample_walks([e.prompt for e in cal_ex], rng)),
                test=(tst_ex, sample_walks([e.prompt for e in tst_ex], rng)))


def score_all(scorer, data: dict) -> dict:
    """The three metrics of a scorer ``(examples, walks) -> (values, masks)`` on ``data``."""
    tp = data["test_pairs"]
    exs = [p[0] for p in tp]
    vp, mp = scorer(exs, [p[1] for p in tp])
    vn, mn = scorer(exs, [p[2] for p in tp])
    cols = middle_columns(exs)
    # pairs whose dispreferred walk has already gone below zero by the middle column
    decided = np.array([first_dip(parse_prompt(e.prompt)[0], parse_prompt(e.prompt)[1] + neg[:c]) is not None
                        for e, neg, c in zip(exs, [p[2] for p in tp], cols)])
    out = {"middle_acc": middle_token_accuracy(vp, vn, cols), "final_acc": final_accuracy(vp, mp, vn, mn),
           "middle_acc_decided": middle_token_accuracy(vp[decided], vn[decided], cols[decided]) if decided.any()
           else float("nan"), "decided_share": float(decided.mean())}
    sets = {}
    for name in ("cal", "test"):
        e, w = data[name]
        v, _ = scorer(e, w)
        steps, truth = walk_truth(e, w)
        sets[name] = (v, steps, truth)
    out["f1"], out["tau"] = first_error_f1(sets["cal"], sets["test"])
    e, w = data["test"]
    exact = oracle_scores(e, w)[0]
    out["value_r2"] = value_r2(sets["test"][0], exact, sets["test"][1])
    out["target_r2"] = value_r2(sets["test"][0], pair_target(exact), sets["test"][1])
    return out


RM_ARMS = ("BT", "TCRM", "oracle", "pair target")  # two trained reward models, then the two ceilings
PPO_ARMS = ("separate critic", "unified")
MODULES = ("rlcourse.methods.tcrm", "rlcourse.supervised", "rlcourse.train", "rlcourse.lm.heads",
           "rlcourse.lm.model", "rlcourse.lm.sampling", "rlcourse.lm.tokenizer", "rlcourse.tasks")


def study_sizes(prof: Profile) -> dict:
    """What every cell of :func:`rm_study` and :func:`ppo_study` reads: the profile (the budget is
    :func:`rm_sizes` of it) and ``rm_seed``, the seed of the TCRM model that PPO optimises."""
    return {"profile": prof.as_dict(), "rm_seed": 0}


def reward_model(arm: str, seed: int, prof: Profile, tokenizer, data: dict | None = None) -> tuple:
    """The reward model of arm ``"BT"`` (:math:`\\lambda = 0`) or ``"TCRM"`` (:func:`rm_sizes`'
    ``lam_mc``, ``lam_td``) trained from ``seed`` on ``data["pairs"]`` (default :func:`rm_data` of
    ``prof`` and ``seed``): the same weights whenever it is called with the same arguments. Returns
    ``(model, log)``, ``log`` as :func:`rlcourse.supervised.train_reward_model` returns it."""
    s = rm_sizes(prof)
    lams = {"BT": (0.0, 0.0), "TCRM": (s["lam_mc"], s["lam_td"])}
    if arm not in lams:
        raise ValueError(f"unknown reward model {arm!r}; the arms are {tuple(lams)}")
    data = rm_data(prof, seed) if data is None else data
    torch.manual_seed(seed)
    rm = new_reward_model(tokenizer, prof, seed)
    log = train_reward_model(rm, tokenizer, data["pairs"], s["rm_steps"], s["rm_batch"], s["rm_lr"], seed=seed,
                             loss="tcrm", loss_kwargs={"lam_mc": lams[arm][0], "lam_td": lams[arm][1]})
    return rm, log


def run_rm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`score_all`'s metrics of arm ``arm`` of :data:`RM_ARMS` on :func:`rm_data` of seed ``seed``:
    a reward model trained by :func:`reward_model` (``BT``, ``TCRM``), or the exact value function
    (``oracle``) or the pair data's target (``pair target``). It depends on ``sizes["profile"]`` and
    ``seed`` only. ``middle_acc_decided`` is ``None`` where no test pair is decided by the middle
    column (:func:`score_all` gives NaN)."""
    if arm not in RM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {RM_ARMS}")
    prof = Profile(**sizes["profile"])
    data = rm_data(prof, seed)
    with one_torch_thread():
        if arm == "oracle":
            out = score_all(oracle_scores, data)
        elif arm == "pair target":
            out = score_all(pair_target_scores, data)
        else:
            tok = build_tokenizer()
            rm, _ = reward_model(arm, seed, prof, tok, data)
            out = score_all(lambda e, w: walk_scores(rm, tok, e, w), data)
    return {k: None if k == "middle_acc_decided" and np.isnan(v) else v for k, v in out.items()}


def _grid(name: str, arms: tuple, run, prof: Profile | None, seeds: int | None) -> Study:
    prof = prof or current_profile()
    seeds = rm_sizes(prof)["seeds"] if seeds is None else seeds
    return Study(name=name, arms=arms, seeds=tuple(range(seeds)), run=run, sizes=study_sizes(prof), modules=MODULES)


def rm_study(prof: Profile | None = None, seeds: int | None = None) -> Study:
    """Every arm of :data:`RM_ARMS` on seeds ``0 .. seeds - 1`` (default :func:`rm_sizes`' ``seeds``)."""
    return _grid("tcrm-rm", RM_ARMS, run_rm_cell, prof, seeds)


def rm_experiment(prof: Profile | None = None, seeds: int | None = None, **run_kw) -> dict:
    """BT-only against TCRM (BT + MC + TD) on walk pairs over seeds, with the exact value function
    (``oracle``) and the regularisers' pair-data target (``pair target``, :func:`pair_target`) as
    ceilings: :func:`rm_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). The models of seed 0 are trained again here by
    :func:`reward_model` (a model cannot go through the cells' cache): the same weights as in the grid.

    ========== ====================== ====================================================
    metrics    ``{arm: [dict, ...]}``  :func:`score_all`'s metrics, one dict per seed
    models     ``{arm: model}``        the ``BT`` and ``TCRM`` reward models of seed 0
    logs       ``{arm: list}``         their training logs
    tokenizer  tokenizer               the walk tokenizer
    seconds    float                   the grid's wall seconds on one core
    sizes      dict                    :func:`rm_sizes` of the profile
    data0      dict                    :func:`rm_data` of seed 0
    ========== ====================== ====================================================
    """
    prof = prof or current_profile()
    study = rm_study(prof, seeds)
    res = run_study(study, **run_kw)
    metrics = {a: [{k: float("nan") if v is None else v for k, v in m.items()} for m in
                   (res.metrics[(a, s)] for s in study.seeds)] for a in study.arms}
    tok, data0 = build_tokenizer(), rm_data(prof, 0)
    models, logs = {}, {}
    with one_torch_thread():
        for arm in ("BT", "TCRM"):
            models[arm], logs[arm] = reward_model(arm, 0, prof, tok, data0)
    return dict(metrics=metrics, models=models, logs=logs, tokenizer=tok, seconds=res.wall_seconds,
                sizes=rm_sizes(prof), data0=data0)


# ---------------------------------------------------------------------------------------- PPO experiment
def data_policy(tokenizer, prof: Profile, seed: int = 0):
    """A tiny LM fitted by SFT to the data policy :math:`\\mu` (fair-coin walks of the right length):
    the policy PPO starts from, and the policy TCRM's values are values of."""
    from ..train import sft

    s, rng = rm_sizes(prof), np.random.default_rng([7, seed])
    model = tiny_lm(tokenizer, prof, seed)
    exs = DyckWalk().examples(4000, seed=seed, split="train")
    demos = [dataclasses.replace(e, solution=w) for e, w in zip(exs, sample_walks([e.prompt for e in exs], rng))]
    sft(model, tokenizer, demos, steps=s["policy_sft_steps"], batch_size=64, lr=3e-3, seed=seed)
    return model


def validity(model, tokenizer, examples, generator) -> float:
    """Share of sampled walks (temperature 1) that are well formed and stay non-negative."""
    b = sample(model, tokenizer, [e.prompt for e in examples], max_new_tokens=WALK_LENGTH + 1, generator=generator)
    return float(DyckWalk().rewards(b.texts, examples).mean())


def state_bytes(trainer) -> dict:
    """Bytes of the model state a PPO step keeps: parameters of every model it holds (policy, critic,
    reward models in use), gradients of the trainable ones, and optimiser moments."""
    models = [trainer.model] + ([trainer.value_model] if trainer.value_model is not None else [])
    name = (trainer.config.reward_kwargs.get("reward_model") or trainer.config.advantage_kwargs.get("reward_model"))
    if name in REWARD_MODELS:
        models.append(REWARD_MODELS[name])
    params = {id(p): p for m in models for p in m.parameters()}
    weights = sum(p.numel() * p.element_size() for p in params.values())
    grads = sum(p.numel() * p.element_size() for p in params.values() if p.requires_grad)
    opt = 0
    for o in (trainer.optimizer, trainer.critic_optimizer):
        if o is not None:
            opt += sum(v.numel() * v.element_size() for st in o.state.values() for v in st.values()
                       if torch.is_tensor(v) and v.ndim > 0)
    return {"weights": weights, "grads": grads, "optimizer": opt, "total": weights + grads + opt}


def run_ppo_cell(arm: str, seed: int, sizes: dict) -> dict:
    """PPO from the data policy with a TCRM reward, arm ``arm`` of :data:`PPO_ARMS`, from ``seed``: a
    separate critic (``gae``, a critic initialised from the reward model, as is usual in RLHF, and
    trained) or the unified model (``tcrm_gae``: the reward model's own values, frozen).

    The cell depends on ``sizes["profile"]`` and ``seed`` only: it trains again the ``TCRM`` reward
    model of seed ``sizes["rm_seed"]`` (:func:`reward_model`) and the seed-0 :func:`data_policy`, the
    same weights in every cell, so every seed optimises the same reward from the same policy.

    ============== =============== =======================================================
    curve          ``(K, 2)``      ``[step, validity]`` at step 0 (the data policy) and every
                                   ``ppo_eval_every`` steps (:func:`validity`)
    final_validity scalar          the last validity of ``curve``
    step_seconds   scalar          median step time (the first step left out)
    update_seconds scalar          median update time
    bytes          dict            :func:`state_bytes`
    rm_score       ``(steps,)``    the mean reward-model score of each step's samples
    ============== =============== =======================================================
    """
    from ..train import RLConfig, Trainer

    if arm not in PPO_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {PPO_ARMS}")
    prof = Profile(**sizes["profile"])
    s, task = rm_sizes(prof), DyckWalk()
    with one_torch_thread():
        tokenizer = build_tokenizer()
        rm, _ = reward_model("TCRM", sizes["rm_seed"], prof, tokenizer)
        name = use_reward_model("tcrm_ppo", rm)
        base = data_policy(tokenizer, prof)
        held = task.examples(s["ppo_eval_walks"], seed=1, split="train")
        base_validity = validity(base, tokenizer, held, torch.Generator().manual_seed(99))
        parts = {"separate critic": dict(advantage_estimator="gae"),
                 "unified": dict(advantage_estimator="tcrm_gae", advantage_kwargs={"reward_model": name})}[arm]
        cfg = RLConfig(num_generations=s["ppo_generations"], prompts_per_step=s["ppo_prompts"],
                       max_completion_length=WALK_LENGTH + 1, steps=s["ppo_steps"], learning_rate=s["ppo_lr"],
                       reward="tcrm_score", reward_kwargs={"reward_model": name}, whiten_advantages=True,
                       progress=False, seed=seed, lam=0.95, **parts)
        critic = None
        if arm == "separate critic":
            critic = copy.deepcopy(rm)
            critic.requires_grad_(True)
        tr = Trainer(copy.deepcopy(base), tokenizer, task, cfg, eval_examples=test_prompts(), value_model=critic)
        curve = [(0, base_validity)]
        while tr.step_count < cfg.steps:
            tr.train(min(cfg.steps, tr.step_count + s["ppo_eval_every"]))
            curve.append((tr.step_count, validity(tr.model, tokenizer, held,
                                                  torch.Generator().manual_seed(1000 + tr.step_count))))
    st = [h["step_seconds"] for h in tr.history]
    return {"curve": curve, "final_validity": curve[-1][1],
            "step_seconds": float(np.median(st[1:] if len(st) > 1 else st)),
            "update_seconds": float(np.median([h["time_update"] for h in tr.history])),
            "bytes": state_bytes(tr), "rm_score": [h["reward"] for h in tr.history]}


def ppo_study(prof: Profile | None = None, seeds: int | None = None) -> Study:
    """Every arm of :data:`PPO_ARMS` on seeds ``0 .. seeds - 1`` (default :func:`rm_sizes`' ``seeds``)."""
    return _grid("tcrm-ppo", PPO_ARMS, run_ppo_cell, prof, seeds)


def ppo_experiment(prof: Profile | None = None, seeds: int | None = None, **run_kw) -> dict:
    """PPO from the data policy with the seed-0 TCRM reward model, with a separate or a unified critic
    (:func:`run_ppo_cell`): :func:`ppo_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`).

    ============== ======================= ================================================
    runs           ``{arm: [dict, ...]}``  :func:`run_ppo_cell`'s metrics, one dict per seed
                                           (``curve`` as a list of ``(step, validity)``)
    base_validity  float                   the data policy's validity
    seconds        float                   the grid's wall seconds on one core
    sizes          dict                    :func:`rm_sizes`
    ============== ======================= ================================================
    """
    prof = prof or current_profile()
    study = ppo_study(prof, seeds)
    res = run_study(study, **run_kw)
    runs = {a: [{**m, "curve": [tuple(p) for p in m["curve"]]} for m in (res.metrics[(a, s)] for s in study.seeds)]
            for a in study.arms}
    return dict(runs=runs, base_validity=runs[study.arms[0]][0]["curve"][0][1], seconds=res.wall_seconds,
                sizes=rm_sizes(prof))
