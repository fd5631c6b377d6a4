"""The Reward models chapter's study: a Bradley-Terry reward model trained on synthetic preferences over
the ``addition`` base model's samples, then best-of-N by the learned reward against the true reward
(:mod:`rlcourse.preferences`); then Gao et al.'s claims and their verdicts.

The grid has one arm, :data:`ARM`, on the profile's seeds (one in smoke). One cell loads the profile's
base model and, from its seed alone, samples, labels and pairs, trains the reward model and runs
best-of-N (:func:`run_cell`), so a cell's numbers do not depend on which cells ran before it.
:func:`run_reward_model_experiment` runs the grid on the study runner (cached per cell) and rebuilds
the dict the chapter reads; :func:`rm_verdicts` evaluates :data:`RM_CLAIMS` on it.
"""
from __future__ import annotations

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..profiles import Profile, one_torch_thread, profile as current_profile
from .runner import Results, Study, run_study

ARM = "Bradley-Terry RM"
MODULES = ("rlcourse.preferences", "rlcourse.train", "rlcourse.lm.heads")
CURVES = ("rm_loss", "rm_train_acc", "proxy", "true", "oracle", "acc_proxy", "acc_oracle")  # per seed, lists
SCALARS = ("pair_acc", "label_agreement", "n_pairs", "base_true", "base_acc", "proxy_offset_std", "top_malformed",
           "base_malformed", "top_consistent", "base_consistent", "top_right", "top_wrong_len", "base_wrong_len",
           "true_wrong_len", "true_right_len")  # per seed, numbers (``true_wrong_len`` NaN without such answers)


def experiment_sizes(prof: Profile) -> dict:
    """The experiment's sizes for a profile."""
    return prof.pick(
        smoke=dict(train_prompts=16, train_samples=4, pairs_per_prompt=4, rm_steps=4, rm_batch=16, rm_lr=1e-3,
                   test_prompts=4, test_samples=8, Ns=[1, 2, 4, 8], seeds=[0], beta=4.0, temperature=1.0,
                   max_new_tokens=10),
        book=dict(train_prompts=400, train_samples=8, pairs_per_prompt=8, rm_steps=300, rm_batch=32, rm_lr=3e-4,
                  test_prompts=48, test_samples=64, Ns=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64], seeds=list(range(prof.seeds)),
                  beta=4.0, temperature=1.0, max_new_tokens=10),
    )


def _favourites(proxy: np.ndarray, rewards: np.ndarray, texts: list, test: list) -> dict:
    """What the reward model likes best among all ``n`` samples of each prompt, against all samples."""
    from ..preferences import parse_final_answer, self_consistent, true_reward

    top, rows = proxy.argmax(1), np.arange(len(test))
    floor = true_reward("", test[0])
    consistent = np.array([[self_consistent(c) for c in t] for t in texts])
    # what the favourites have in common: a final answer with the wrong number of digits
    values = [[parse_final_answer(c) for c in t] for t in texts]
    wrong_len = np.array([[v is not None and len(str(v)) != len(str(e.answer)) for v in row]
                          for row, e in zip(values, test)])
    return {"top_malformed": float((rewards[rows, top] == floor).mean()),
            "base_malformed": float((rewards == floor).mean()),
            "top_consistent": float(consistent[rows, top].mean()), "base_consistent": float(consistent.mean()),
            "top_right": float((rewards[rows, top] == 0).mean()), "top_wrong_len": float(wrong_len[rows, top].mean()),
            "base_wrong_len": float(wrong_len.mean()),
            "true_wrong_len": float(rewards[wrong_len].mean()) if wrong_len.any() else None,  # JSON has no NaN
            "true_right_len": float(rewards[~wrong_len].mean()),
            "top_picks": [[e.prompt, e.answer, texts[i][top[i]], float(rewards[i, top[i]])]
                          for i, e in enumerate(test[:8])]}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train a reward model from ``seed`` and run best-of-N with it (``K`` values of N, ``S`` steps).

    ================  ==========  ==========================================================
    rm_loss, ...      ``(S,)``    reward-model training loss and accuracy per step
    proxy, true, ...  ``(K,)``    best-of-N curves (proxy in true-reward units: score / beta)
    pair_acc, ...     scalar      the numbers of :data:`SCALARS` (``None`` for NaN)
    top_picks         8 rows      ``[prompt, answer, favourite completion, its true reward]``
    ================  ==========  ==========================================================
    """
    from ..lm.heads import ScalarHeadModel
    from ..lm.zoo import load_base_model
    from ..preferences import best_of_n_curve, make_preference_pairs, pair_accuracy, sample_groups, score_completions
    from ..tasks import get_task
    from ..train import train_reward_model

    if arm != ARM:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(ARM,)}")
    cfg = sizes
    with one_torch_thread():
        base, tok = load_base_model("addition", "medium", prof=Profile(**sizes["profile"]), progress=False)
        task = get_task("addition")
        test = task.examples(cfg["test_prompts"], seed=1000, split="test")
        gen, rng = torch.Generator().manual_seed(10_000 + seed), np.random.default_rng(seed)
        train = task.examples(cfg["train_prompts"], seed=100 + seed, split="train")
        sampling = (cfg["max_new_tokens"], cfg["temperature"], gen)
        texts, rewards = sample_groups(base, tok, train, cfg["train_samples"], *sampling)
        pairs, agrees = make_preference_pairs([e.prompt for e in train], texts, rewards, cfg["pairs_per_prompt"],
                                              cfg["beta"], rng)
        torch.manual_seed(seed)
        rm = ScalarHeadModel.from_policy(base)
        log = train_reward_model(rm, tok, pairs, steps=cfg["rm_steps"], batch_size=cfg["rm_batch"], lr=cfg["rm_lr"],
                                 seed=seed)
        t_texts, t_rewards = sample_groups(base, tok, test, cfg["test_samples"], *sampling)
        flat = score_completions(rm, tok, [e.prompt for e, t in zip(test, t_texts) for _ in t],
                                 [c for t in t_texts for c in t])
        proxy = flat.reshape(t_rewards.shape) / cfg["beta"]  # the RM estimates beta * r + c(x)
        curve = best_of_n_curve(proxy, t_rewards, cfg["Ns"])
        acc = best_of_n_curve(proxy, (t_rewards == 0).astype(float), cfg["Ns"])
        return {"rm_loss": [h["loss"] for h in log], "rm_train_acc": [h["accuracy"] for h in log],
                "pair_acc": pair_accuracy(rm, tok, [e.prompt for e in test], t_texts, t_rewards, proxy),
                "label_agreement": float(agrees.mean()), "proxy": curve["proxy"].tolist(),
                "true": curve["true"].tolist(), "oracle": curve["oracle"].tolist(),
                "acc_proxy": acc["true"].tolist(), "acc_oracle": acc["oracle"].tolist(), "n_pairs": len(pairs),
                "base_true": float(t_rewards.mean()), "base_acc": float((t_rewards == 0).mean()),
                # the per-prompt offset c(x) that Bradley-Terry cannot pin down: spread of per-prompt means
                "proxy_offset_std": float(proxy.mean(1).std()),
                **_favourites(proxy, t_rewards, t_texts, test)}


def rm_study(P: Profile) -> Study:
    """The chapter's grid: :data:`ARM` on the seeds of :func:`experiment_sizes`."""
    z = experiment_sizes(P)
    return Study(name="reward_models", arms=(ARM,), seeds=tuple(z["seeds"]), run=run_cell,
                 sizes={**z, "profile": P.as_dict()}, verdicts=verdicts, modules=MODULES)


def experiment_output(results: Results) -> dict:
    """The chapter's dict from a :func:`rm_study`'s results (``N`` seeds, ``K`` values of N, ``S`` steps).

    =================  ==========  ========================================================
    rm_loss, ...       ``(N, S)``  reward-model training loss and accuracy
    proxy, true, ...   ``(N, K)``  best-of-N curves of :data:`CURVES`
    pair_acc, ...      ``(N,)``    the numbers of :data:`SCALARS` (NaN where undefined)
    top_picks          ``N`` rows  per seed, 8 tuples ``(prompt, answer, favourite, reward)``
    Ns, config         ...         the values of N and :func:`experiment_sizes`
    profile, seconds   str, float  the profile's name, wall seconds of the grid's cells
    =================  ==========  ========================================================
    """
    study = results.study
    out = {k: np.array(results.values(ARM, k)) for k in CURVES}
    for k in SCALARS:
        out[k] = np.array([np.nan if v is None else v for v in results.values(ARM, k)])
    out["top_picks"] = [[tuple(row) for row in picks] for picks in results.values(ARM, "top_picks")]
    z = {k: v for k, v in study.sizes.items() if k != "profile"}
    out.update(Ns=np.array(z["Ns"]), config=z, profile=study.sizes["profile"]["name"], seconds=results.wall_seconds)
    return out


def run_reward_model_experiment(prof: Profile | None = None, **run_kw) -> dict:
    """Train a Bradley-Terry reward model on synthetic preferences over the addition base model's
    samples, then run best-of-N by the learned reward against the true reward, for several seeds:
    :func:`rm_study` on the study runner (``prof`` by default the current one; ``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), as
    :func:`experiment_output`'s dict. Per seed (arrays stacked over seeds): ``rm_loss`` (training
    curve), ``pair_acc`` (held-out pair accuracy), ``label_agreement`` (how often the noisy labels
    agreed with the true reward), the best-of-N curves ``proxy`` (in true-reward units: score / beta),
    ``true``, ``oracle`` and ``acc_proxy`` / ``acc_oracle`` (fraction correct of the selected answer),
    the base model's mean true reward and the number of pairs."""
    return experiment_output(run_study(rm_study(prof or current_profile()), **run_kw))


_GAO = "Gao, Schulman and Hilton, Scaling Laws for Reward Model Overoptimization, 2022, arXiv:2210.10760"
RM_CLAIMS = {
    "falls": Claim(
        key="reward_models/gold-reward-falls-under-best-of-n", paper=_GAO,
        statement="as best-of-n optimises a proxy reward model harder, the gold reward first rises and then "
                  "falls (tested here: at the largest n it is below its n = 1 value)",
        source="abstract and section 3 (best-of-n results)",
        setting="tiny Llama addition model (the lab's medium base); Bradley-Terry reward model from its trunk, "
                "trained on 400 prompts x 8 pairs labelled by a graded true reward at beta = 4; best-of-N on 48 "
                "held-out prompts x 64 samples",
        metric="true reward of the proxy's pick, unbiased best-of-N estimate", method="N = 64", baseline="N = 1",
        kind="less", margin=0.0),
    "proxy_rises": Claim(
        key="reward_models/proxy-rises-under-best-of-n", paper=_GAO,
        statement="the proxy reward of the best-of-n pick rises monotonically with n",
        source="abstract and section 3", setting="as for the gold-reward claim",
        metric="proxy score of the proxy's pick, in true-reward units", method="N = 64", baseline="N = 1",
        kind="greater", margin=0.0),
}


def rm_verdicts(res: dict) -> dict[str, Verdict]:
    """The verdicts of :data:`RM_CLAIMS` on :func:`run_reward_model_experiment`'s output (one value per seed)."""
    s = res["seconds"]
    return {"falls": evaluate(RM_CLAIMS["falls"], res["true"][:, -1], res["true"][:, 0], seconds=s),
            "proxy_rises": evaluate(RM_CLAIMS["proxy_rises"], res["proxy"][:, -1], res["proxy"][:, 0], seconds=s)}


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`rm_verdicts` on a :func:`rm_study`'s results."""
    return rm_verdicts(experiment_output(results))
