"""Poly-EPO's experiments: a multi-strategy bandit (one softmax over strategies shared by all prompts) with
GRPO, a diversity bonus, set RL with ``f = max r`` and Poly-EPO as arms, and GRPO against ``poly_epo`` on the
tiny countdown model, with their claims (the set objectives, the advantages and the registered estimators
are in :mod:`rlcourse.methods.poly_epo`).

Each grid is a study on the one runner (cached per cell): :func:`bandit_study` (one cell:
:func:`run_bandit_cell`) and :func:`lm_study` (one cell: :func:`run_lm_cell`, which loads the base model
itself); the base model's samples are a one-cell study (:func:`lm_base_study`). The ``run_*`` functions
rebuild the chapter's dicts.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from ..advantages import get_estimator
from ..claims import Claim, Verdict, evaluate
from ..methods.poly_epo import PAPER, countdown_strategy, normalise_groups, set_advantage
from ..metrics import mean_pass_at_k, modes_above
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study


# ---------------------------------------------------------------------- experiment 1: the multi-strategy bandit
@dataclass(frozen=True)
class BanditConfig:
    """The multi-strategy bandit: each prompt is solved by some of the strategies (deterministically);
    the policy is one softmax over strategies shared by all prompts (a model's habits), so a strategy
    learnt on one prompt is used on every other, held-out prompts included."""

    prompts: int = 10  # training prompts
    strategies: int = 6
    dominant_share: float = 0.6  # strategy 0 solves this share of the training prompts
    minority_p: float = 0.25  # each other strategy solves each prompt with this probability
    held_out: int = 40
    samples: int = 8  # N, samples per prompt and step
    subset: int = 4  # n, the set size of the set objectives
    steps: int = 150
    lr: float = 0.5  # SGD on the logits, per-group normalised advantages
    init_scale: float = 0.5  # initial logits ~ N(0, init_scale^2)
    lam: float = 0.5  # weight of the additive diversity bonus


def make_strategy_bandit(cfg: BanditConfig, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(P, S)`` and ``(H, S)`` 0/1 solve matrices of the training and held-out prompts, and the
    ``(S,)`` initial logits. Strategy 0 solves exactly ``dominant_share`` of the training prompts (and
    each held-out prompt with that probability); the others solve each prompt with probability
    ``minority_p``, redrawn until each solves fewer training prompts than strategy 0 and every
    training prompt is solved by some strategy."""
    rng = np.random.default_rng(30_000 + seed)
    P, S = cfg.prompts, cfg.strategies
    while True:
        train = (rng.random((P, S)) < cfg.minority_p).astype(float)
        train[:, 0] = 0.0
        train[rng.permutation(P)[:round(cfg.dominant_share * P)], 0] = 1.0
        if train.any(1).all() and (train[:, 1:].sum(0) < train[:, 0].sum()).all():
            break
    held = (rng.random((cfg.held_out, S)) < cfg.minority_p).astype(float)
    held[:, 0] = (rng.random(cfg.held_out) < cfg.dominant_share).astype(float)
    return train, held, rng.normal(0, cfg.init_scale, S)


BANDIT_ARMS = {  # arm -> set objective (None: the registered grpo estimator)
    "GRPO": None,
    "GRPO + diversity bonus": "additive",
    "set RL, f = max r": "max",
    "Poly-EPO": "poly",
}
KS = (1, 2, 4, 8, 16)


def bandit_advantages(arm: str, rewards: torch.Tensor, strategies: torch.Tensor, cfg: BanditConfig) -> torch.Tensor:
    """``(G, N)`` advantages of one step for ``arm``: GRPO through the registered estimator; the set
    objectives through :func:`~rlcourse.methods.poly_epo.set_advantage`, each group divided by its std (as
    ``poly_epo`` does)."""
    objective = BANDIT_ARMS[arm]
    G, N = rewards.shape
    if objective is None:
        index = torch.arange(G).repeat_interleave(N)
        adv, _ = get_estimator("grpo")(rewards.reshape(-1, 1), torch.ones(G * N, 1), index)
        return adv.reshape(G, N).double()
    a = set_advantage(rewards, strategies, cfg.subset, objective, cfg.lam)
    return normalise_groups(a)


def bandit_metrics(probs: np.ndarray, train: np.ndarray, held: np.ndarray, rng: np.random.Generator) -> dict:
    """Exact pass@k on the training prompts (``1 - (1 - q_p)^k``, ``q_p`` the policy's success
    probability on prompt ``p``), strategies with mass above 1% (``metrics.modes_above`` on 5,000
    draws), and pass@1 on the held-out prompts that only minority strategies solve."""
    q = train @ probs
    minority = (held[:, 0] == 0) & held[:, 1:].any(1)
    draws = rng.choice(len(probs), size=5000, p=probs)
    return {"pass": np.array([np.mean(1 - (1 - q) ** k) for k in KS]), "modes": modes_above(draws.tolist(), 0.01),
            "held_minority": float((held[minority] @ probs).mean()) if minority.any() else float("nan"),
            "held_pass1": float((held @ probs).mean())}


def train_strategy_bandit(arm: str, cfg: BanditConfig, seed: int, every: int = 10) -> dict:
    """One run of ``arm`` (a key of :data:`BANDIT_ARMS`): each step samples ``N`` strategies for every
    training prompt, scores them, and takes an SGD step on the logits along
    ``mean_i A_i grad log pi(s_i)``. Returns the final :func:`bandit_metrics`, ``curve`` ``(T', K)``
    pass@k every ``every`` steps, ``mass`` ``(T', S)`` the policy, and ``dominant`` (its final mass)."""
    if arm not in BANDIT_ARMS:
        raise ValueError(f"arm must be one of {list(BANDIT_ARMS)}, got {arm!r}")
    train, held, theta = make_strategy_bandit(cfg, seed)
    rng = np.random.default_rng(seed)
    S, curve, mass = cfg.strategies, [], []
    for t in range(cfg.steps + 1):
        probs = np.exp(theta - theta.max())
        probs /= probs.sum()
        if t % every == 0 or t == cfg.steps:
            q = train @ probs
            curve.append([np.mean(1 - (1 - q) ** k) for k in KS])
            mass.append(probs)
        if t == cfg.steps:
            break
        s = np.minimum(np.searchsorted(np.cumsum(probs), rng.random((cfg.prompts, cfg.samples))), S - 1)  # (P, N)
        r = train[np.arange(cfg.prompts)[:, None], s]
        adv = bandit_advantages(arm, torch.from_numpy(r), torch.from_numpy(s), cfg).numpy()
        onehot = np.eye(S)[s]  # (P, N, S): grad log pi(s) = e_s - pi
        theta = theta + cfg.lr * (adv[..., None] * (onehot - probs)).mean((0, 1))
    out = bandit_metrics(probs, train, held, rng)
    out.update(curve=np.array(curve), mass=np.array(mass), dominant=float(probs[0]))
    return out


MODULES = ("rlcourse.methods.poly_epo", "rlcourse.advantages", "rlcourse.metrics")


def run_bandit_cell(arm: str, seed: int, sizes: dict) -> dict:
    """One :func:`train_strategy_bandit` run of ``arm`` (a key of :data:`BANDIT_ARMS`) on the bandit of
    ``seed``, with the :class:`BanditConfig` stored in ``sizes["config"]``. With ``T'`` logged steps:

    ==============  ============  =============================================================
    pass            ``(K,)``      final exact pass@k on the training prompts, k in :data:`KS`
    modes           int           strategies with mass above 1%
    held_minority   scalar        held-out pass@1 where only minority strategies solve (``None``
                                  where no such prompt was drawn)
    held_pass1      scalar        held-out pass@1
    curve           ``(T', K)``   pass@k every 10 steps
    mass            ``(T', S)``   the policy every 10 steps
    dominant        scalar        the final mass of strategy 0
    ==============  ============  =============================================================
    """
    if arm not in BANDIT_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(BANDIT_ARMS)}")
    with one_torch_thread():
        r = train_strategy_bandit(arm, BanditConfig(**sizes["config"]), seed)
    held = r["held_minority"]
    return {"pass": r["pass"].tolist(), "modes": r["modes"], "held_minority": None if held != held else held,
            "held_pass1": r["held_pass1"], "curve": r["curve"].tolist(), "mass": r["mass"].tolist(),
            "dominant": r["dominant"]}


def bandit_study(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None) -> Study:
    """Every arm of :data:`BANDIT_ARMS` on ``seeds`` (default ``P.toy_seeds``) seeds, with ``cfg``
    (default: the profile's steps)."""
    cfg = cfg or BanditConfig(steps=P.pick(smoke=20, book=150))
    return Study(name="poly_epo-bandit", arms=tuple(BANDIT_ARMS), seeds=tuple(range(seeds or P.toy_seeds)),
                 run=run_bandit_cell, sizes={"config": asdict(cfg)}, verdicts=bandit_study_verdicts, modules=MODULES)


def bandit_output(results: Results) -> dict:
    """:func:`run_bandit_experiment`'s dict from a :func:`bandit_study`'s results."""
    get = lambda arm, key: [np.asarray(v) for v in results.values(arm, key)]  # noqa: E731
    out = {k: {} for k in ("final", "modes", "held", "curve", "mass", "dominant")}
    for arm in results.study.arms:
        out["final"][arm] = np.stack(get(arm, "pass"))
        out["modes"][arm] = np.array(results.values(arm, "modes"), dtype=float)
        out["held"][arm] = np.array([np.nan if v is None else v for v in results.values(arm, "held_minority")])
        out["curve"][arm] = np.stack(get(arm, "curve"))
        out["mass"][arm] = np.stack(get(arm, "mass"))
        out["dominant"][arm] = np.array(results.values(arm, "dominant"))
    out.update(cfg=BanditConfig(**results.study.sizes["config"]), seeds=len(results.study.seeds), ks=KS,
               seconds=results.wall_seconds)
    return out


def run_bandit_experiment(P: Profile, cfg: BanditConfig | None = None, seeds: int | None = None, **run_kw) -> dict:
    """Every arm over ``P.toy_seeds`` paired seeds (a seed fixes the bandit and the initial policy):
    :func:`bandit_study` on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`).
    ``final[arm]`` ``(seeds, K)`` pass@k, ``modes[arm]``, ``held[arm]`` ``(seeds,)``, ``curve[arm]``
    ``(seeds, T', K)``, ``mass[arm]`` ``(seeds, T', S)``, ``dominant[arm]`` ``(seeds,)``."""
    return bandit_output(run_study(bandit_study(P, cfg, seeds), **run_kw))


SETTING = ("one softmax over 6 strategies shared by 10 training prompts (strategy 0 solves 6 of them, each other "
           "strategy a random quarter), N = 8 samples per prompt and step, set size n = 4, 150 SGD steps (lr 0.5) on "
           "per-group normalised advantages; 40 held-out prompts drawn alike")


def bandit_claims() -> dict[str, Claim]:
    common = dict(paper=PAPER, source="abstract (higher pass@k, more diversity) and the authors' set-RL page",
                  setting=SETTING, baseline="GRPO", kind="greater", margin=0.0,
                  paper_number="Qwen3-4B benchmarks (not reproduced)")
    return {
        "pass4": Claim(key="poly_epo/bandit-pass4", statement="Poly-EPO reaches a higher pass@k than GRPO (k = 4)",
                       metric="exact pass@4 on the training prompts after training", method="Poly-EPO",
                       control="poly_epo/bandit-control-setmax", **common),
        "pass16": Claim(key="poly_epo/bandit-pass16", statement="Poly-EPO reaches a higher pass@k than GRPO (k = 16)",
                        metric="exact pass@16 on the training prompts after training", method="Poly-EPO",
                        control="poly_epo/bandit-control-setmax", **common),
        "modes": Claim(key="poly_epo/bandit-strategies", statement="Poly-EPO keeps more distinct strategies than GRPO",
                       metric="strategies with mass > 1% (metrics.modes_above on 5,000 draws)", method="Poly-EPO",
                       unit="{:.2f}", **common),
        "held": Claim(key="poly_epo/bandit-heldout-minority", statement="Poly-EPO solves more held-out prompts that "
                      "only minority strategies solve", metric="pass@1 on the held-out prompts the dominant "
                      "strategy fails and another solves", method="Poly-EPO", **common),
        "control": Claim(key="poly_epo/bandit-control-setmax", role="positive control", statement="positive control: set RL with f = max r "
                         "(pass@n, an objective that pays for coverage directly) beats GRPO at pass@16",
                         metric="exact pass@16 on the training prompts after training", method="set RL, f = max r",
                         **common),
    }


def bandit_study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`bandit_verdicts` on a :func:`bandit_study`'s results."""
    return bandit_verdicts(bandit_output(results))


def bandit_verdicts(out: dict) -> dict[str, Verdict]:
    """The bandit's claims; the pass@k claims rest on the set-max control (an objective that pays for
    coverage directly must beat GRPO at pass@16 here, or the bandit cannot show a pass@k gain)."""
    c, f, s = bandit_claims(), out["final"], out["seconds"]
    k4, k16 = KS.index(4), KS.index(16)
    g = "GRPO"
    control = evaluate(c["control"], f["set RL, f = max r"][:, k16], f[g][:, k16], seconds=s)
    return {"pass4": evaluate(c["pass4"], f["Poly-EPO"][:, k4], f[g][:, k4], seconds=s, control=control),
            "pass16": evaluate(c["pass16"], f["Poly-EPO"][:, k16], f[g][:, k16], seconds=s, control=control),
            "modes": evaluate(c["modes"], out["modes"]["Poly-EPO"], out["modes"][g], seconds=s),
            "held": evaluate(c["held"], out["held"]["Poly-EPO"], out["held"][g], seconds=s),
            "control": control}


# ---------------------------------------------------------------------- experiment 2: the tiny LM on countdown
LM_KS = (1, 2, 4, 8, 16)


def sample_strategies(model, tokenizer, examples, n: int, generator: torch.Generator, max_new_tokens: int = 8,
                      chunk: int = 32) -> dict:
    """``n`` samples per countdown example at temperature 1: ``correct`` ``(P, n)`` 0/1 and
    ``strategies`` (``P`` lists of :func:`~rlcourse.methods.poly_epo.countdown_strategy` labels)."""
    from ..lm.sampling import sample
    from ..tasks import get_task

    task, correct, labels = get_task("countdown"), [], []
    for s in range(0, len(examples), chunk):
        part = list(examples[s:s + chunk])
        b = sample(model, tokenizer, [e.prompt for e in part], num_generations=n, max_new_tokens=max_new_tokens,
                   generator=generator)
        correct.append(task.rewards(b.texts, [e for e in part for _ in range(n)]).reshape(len(part), n))
        lab = [countdown_strategy(t) for t in b.texts]
        labels += [lab[i * n:(i + 1) * n] for i in range(len(part))]
    return {"correct": np.concatenate(correct).astype(float), "strategies": labels}


def strategy_summary(ev: dict, ks=LM_KS) -> dict:
    """pass@k (``metrics.mean_pass_at_k``), the mean number of distinct *correct* strategies per prompt,
    and the strategies with mass > 1% among the correct samples of all prompts."""
    from ..metrics import distinct_correct

    correct, labels = ev["correct"], ev["strategies"]
    right = [s for row, ok in zip(labels, correct) for s, c in zip(row, ok) if c]
    return {"pass": np.array(list(mean_pass_at_k(correct, ks).values())),
            "distinct_correct": float(np.mean([distinct_correct(row, ok) for row, ok in zip(labels, correct)])),
            "modes_correct": modes_above(right, 0.01) if right else 0}


LM_ARMS = {"GRPO": dict(advantage_estimator="grpo"),
           "Poly-EPO": dict(advantage_estimator="poly_epo", advantage_kwargs={"subset_size": 4})}


BASE = "base model"  # the one cell of :func:`lm_base_study`: the base model's samples
LM_MODULES = (*MODULES, "rlcourse.train", "rlcourse.lm.sampling")


def lm_sizes(P: Profile, steps: int | None = None, lr: float = 1e-4) -> dict:
    """Every setting an LM cell reads, for profile ``P`` (``steps`` overrides the profile's)."""
    return {"profile": P.as_dict(), "steps": steps or P.pick(smoke=2, book=30), "lr": lr,
            "held_prompts": P.pick(smoke=8, book=48), "samples": P.pick(smoke=4, book=16),
            "num_generations": P.pick(smoke=4, book=8), "prompts_per_step": P.pick(smoke=2, book=8),
            "subset_size": P.pick(smoke=2, book=4)}


def _lm_base(sizes: dict):
    """The countdown 'weak' base model, its tokenizer, the held-out prompts and the pass@k's ``k``."""
    from ..lm import load_base_model
    from ..tasks import get_task

    model, tok = load_base_model("countdown", "weak", prof=Profile(**sizes["profile"]), progress=False)
    held = get_task("countdown").examples(sizes["held_prompts"], seed=4321, split="test")
    return model, tok, held, tuple(k for k in LM_KS if k <= sizes["samples"])


def _summary(ev: dict, ks) -> dict:
    """:func:`strategy_summary` with ``pass`` as a list (a cell's metrics)."""
    out = strategy_summary(ev, ks)
    return {**out, "pass": out["pass"].tolist()}


def run_lm_base_cell(arm: str, seed: int, sizes: dict) -> dict:
    """The base model's :func:`strategy_summary` (samples drawn from seed 0); ``arm`` must be :data:`BASE`."""
    if arm != BASE:
        raise ValueError(f"unknown arm {arm!r}; the arms are {(BASE,)}")
    with one_torch_thread():
        model, tok, held, ks = _lm_base(sizes)
        return _summary(sample_strategies(model, tok, held, sizes["samples"], torch.Generator().manual_seed(0)), ks)


def run_lm_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train the base model with arm ``arm`` of :data:`LM_ARMS` from ``seed`` (set size
    ``sizes["subset_size"]`` for Poly-EPO): ``reward`` ``(T,)`` the training reward per step and
    ``summary`` the :func:`strategy_summary` of ``sizes["samples"]`` samples per held-out prompt."""
    from ..train import RLConfig, Trainer

    if arm not in LM_ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(LM_ARMS)}")
    parts = copy.deepcopy(LM_ARMS[arm])
    if arm == "Poly-EPO":
        parts["advantage_kwargs"] = {"subset_size": sizes["subset_size"]}
    with one_torch_thread():
        model, tok, held, ks = _lm_base(sizes)
        cfg = RLConfig(num_generations=sizes["num_generations"], prompts_per_step=sizes["prompts_per_step"],
                       steps=sizes["steps"], learning_rate=sizes["lr"], max_completion_length=8, seed=seed,
                       progress=False, **parts)
        trainer = Trainer(model, tok, "countdown", cfg, eval_examples=held[:4])
        trainer.train()
        ev = sample_strategies(trainer.model, tok, held, sizes["samples"], torch.Generator().manual_seed(1 + seed))
        return {"reward": [m["reward"] for m in trainer.history], "summary": _summary(ev, ks)}


def lm_base_study(P: Profile, steps: int | None = None, lr: float = 1e-4) -> Study:
    """The one-cell study of the base model's summary (:func:`run_lm_base_cell`), shared by every cell."""
    return Study(name="poly_epo-lm-base", arms=(BASE,), seeds=(0,), run=run_lm_base_cell,
                 sizes=lm_sizes(P, steps, lr), modules=LM_MODULES)


def lm_study(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4) -> Study:
    """Every arm of :data:`LM_ARMS` on ``seeds`` (default ``P.seeds``) paired seeds."""
    return Study(name="poly_epo-lm", arms=tuple(LM_ARMS), seeds=tuple(range(seeds or P.seeds)), run=run_lm_cell,
                 sizes=lm_sizes(P, steps, lr), modules=LM_MODULES)


def run_lm_experiment(P: Profile, seeds: int | None = None, steps: int | None = None, lr: float = 1e-4,
                      **run_kw) -> dict:
    """GRPO against ``poly_epo`` (N = 8, n = 4) on the tiny countdown model, ``P.seeds`` paired seeds:
    :func:`lm_study` and :func:`lm_base_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`). Returns ``summary[arm]`` (a list of
    :func:`strategy_summary` per seed), ``base`` (the base model's), ``reward[arm]`` ``(seeds, steps)``
    the training reward, ``seconds``."""
    base = run_study(lm_base_study(P, steps, lr), **run_kw)
    results = run_study(lm_study(P, seeds, steps, lr), **run_kw)
    sz = results.study.sizes
    summary = lambda m: {**m, "pass": np.array(m["pass"])}  # noqa: E731
    out = {"summary": {arm: [summary(m) for m in results.values(arm, "summary")] for arm in LM_ARMS},
           "reward": {arm: np.array(results.values(arm, "reward")) for arm in LM_ARMS},
           "base": summary(base.metrics[(BASE, 0)])}
    out.update(seeds=len(results.study.seeds), steps=sz["steps"], ks=tuple(k for k in LM_KS if k <= sz["samples"]),
               samples=sz["samples"], prompts=sz["held_prompts"], seconds=base.wall_seconds + results.wall_seconds)
    return out


LM_SETTING = ("tiny Llama pre-trained on countdown (3 numbers, + - *) to about 20% greedy accuracy; GRPO against "
              "poly_epo (N = 8, n = 4, strategies = operator sequences), 8 prompts x 8 samples per step, 30 steps, "
              "lr 1e-4; 48 held-out prompts x 16 samples")


def lm_claims() -> dict[str, Claim]:
    common = dict(paper=PAPER, source="abstract (higher pass@k, more diversity)", setting=LM_SETTING,
                  paper_number="Qwen3-4B benchmarks (not reproduced)", kind="greater", margin=0.0)
    return {"pass8": Claim(key="poly_epo/lm-pass8", statement="Poly-EPO reaches a higher pass@k than GRPO (k = 8)",
                           metric="unbiased pass@8 on held-out prompts", method="Poly-EPO", baseline="GRPO",
                           control="poly_epo/lm-control", **common),
            "distinct": Claim(key="poly_epo/lm-distinct", statement="Poly-EPO's correct answers use more distinct "
                              "strategies than GRPO's", metric="distinct correct operator sequences per held-out "
                              "prompt (16 samples)", method="Poly-EPO", baseline="GRPO", unit="{:.2f}",
                              control="poly_epo/lm-control", **common),
            "control": Claim(key="poly_epo/lm-control", role="positive control", statement="movement control: GRPO "
                             "raises pass@1 above the base model (the run is long enough to move the policy; it does "
                             "not show that a pass@8 or diversity gain would be detectable)",
                             metric="unbiased pass@1 on held-out prompts",
                             method="GRPO", baseline=None, reference=0.0, **common)}


def lm_verdicts(out: dict) -> dict[str, Verdict]:
    c, s = lm_claims(), out["seconds"]
    k8 = out["ks"].index(8) if 8 in out["ks"] else len(out["ks"]) - 1
    get = lambda arm, key, i=None: np.array([m[key] if i is None else m[key][i] for m in out["summary"][arm]])  # noqa: E731
    moved = evaluate(replace(c["control"], reference=float(out["base"]["pass"][0])), get("GRPO", "pass", 0), seconds=s)
    return {"pass8": evaluate(c["pass8"], get("Poly-EPO", "pass", k8), get("GRPO", "pass", k8), seconds=s,
                              control=moved),
            "distinct": evaluate(c["distinct"], get("Poly-EPO", "distinct_correct"), get("GRPO", "distinct_correct"),
                                 seconds=s, control=moved),
            "control": moved}
