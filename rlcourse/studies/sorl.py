"""SORL's experiment: a tabular multi-turn "code lock" trained from stale batches with each arm's
registered loss, its claims and the learning-rate sweep, and the tiny LM on the text FrozenLake (the
ratios, the normaliser and the registered losses ``"turn_ppo"`` and ``"sorl"`` are in
:mod:`rlcourse.methods.sorl`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..losses import get_policy_loss
from ..methods.sorl import PAPER, level_log_ratio
from ..ops import masked_mean
from ..profiles import Profile, one_torch_thread
from ..snapshots import push_lagged
from .runner import Results, Study, run_study


# ---------------------------------------------------------------------- the toy: a multi-turn code lock
@dataclass(frozen=True)
class LockConfig:
    """A multi-turn "code lock": ``doors`` doors in a row, each with a code of ``turn_len`` symbols out of
    ``symbols``. Each turn the agent types a code for the door it stands at; the environment replies
    "open" (the agent moves on) or "locked" (it stays). The episode ends when every door is open or
    after ``max_turns`` turns; the return is the share of doors opened. The policy is tabular:
    independent softmaxes over symbols per (context, door, position)."""

    contexts: int = 8  # lock instances ("prompts"), each with its own codes
    doors: int = 3
    turn_len: int = 4
    symbols: int = 2
    max_turns: int = 6
    samples: int = 16  # G episodes per context per step
    steps: int = 100
    epochs: int = 4  # gradient steps on each batch
    lr: float = 100.0  # SGD on the logits, no gradient clipping (token-mean loss: small gradients)
    eps: float = 0.2


def make_codes(cfg: LockConfig, seed: int) -> torch.Tensor:
    """``(C, doors, turn_len)`` long: the code of every door of every context."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    return torch.randint(0, cfg.symbols, (cfg.contexts, cfg.doors, cfg.turn_len), generator=gen)


def play_lock(logits: torch.Tensor, codes: torch.Tensor, cfg: LockConfig, gen: torch.Generator) -> dict:
    """Play ``G = cfg.samples`` episodes per context with the tabular policy ``logits``.

    ============== ================= ===============================================
    logits         ``(C,D,n,V)``     the (behaviour) policy
    returns                          dict of tensors, ``B = C * G`` rows, ``T = max_turns * n`` tokens:
    tokens         ``(B,T)`` long    the symbols typed (0 after the episode ended)
    door           ``(B,T)`` long    the door each token was typed at
    position       ``(B,T)`` long    the token's position in its turn
    context        ``(B,)``  long    the context (group) of each row
    response_mask  ``(B,T)``         1 on the turns played
    turn_index     ``(B,T)`` long    the turn of each token
    reward         ``(B,)``          share of doors opened
    ============== ================= ===============================================
    """
    C, D, n, V = logits.shape
    G, H = cfg.samples, cfg.max_turns
    B = C * G
    ctx = torch.arange(C).repeat_interleave(G)
    door = torch.zeros(B, dtype=torch.long)
    alive = torch.ones(B, dtype=torch.bool)
    toks, doors, masks = [], [], []
    probs = torch.softmax(logits, -1)
    for _ in range(H):
        p = probs[ctx, door.clamp(max=D - 1)]  # (B, n, V)
        y = torch.multinomial(p.reshape(-1, V), 1, generator=gen).reshape(B, n)
        ok = alive & (y == codes[ctx, door.clamp(max=D - 1)]).all(-1)
        toks.append(torch.where(alive[:, None], y, 0))
        doors.append(door.clamp(max=D - 1)[:, None].expand(B, n))
        masks.append(alive[:, None].expand(B, n).float())
        door = door + ok.long()
        alive = alive & (door < D)
    return {"tokens": torch.cat(toks, 1), "door": torch.cat(doors, 1),
            "position": torch.arange(n).repeat(H)[None].expand(B, -1), "context": ctx,
            "response_mask": torch.cat(masks, 1), "turn_index": torch.arange(H).repeat_interleave(n)[None].expand(B, -1),
            "reward": door.float() / D}


def lock_log_probs(logits: torch.Tensor, ep: dict) -> torch.Tensor:
    """``(B,T)`` log-probs of the episode's tokens under ``logits`` (gradient flows to ``logits``)."""
    logp = torch.log_softmax(logits, -1)
    ctx = ep["context"][:, None].expand_as(ep["tokens"])
    return logp[ctx, ep["door"], ep["position"], ep["tokens"]]


def expected_lock_return(logits: torch.Tensor, codes: torch.Tensor, cfg: LockConfig) -> float:
    """Exact expected return of the tabular policy (dynamic programming over doors and turns)."""
    with torch.no_grad():
        p_open = torch.softmax(logits, -1).gather(-1, codes[..., None]).squeeze(-1).prod(-1)  # (C, D)
        C, D = p_open.shape
        dist = torch.zeros(C, D + 1)
        dist[:, 0] = 1.0
        for _ in range(cfg.max_turns):
            new = dist.clone()
            new[:, :D] = dist[:, :D] * (1 - p_open)
            new[:, 1:] += dist[:, :D] * p_open
            dist = new
        return float((dist * torch.arange(D + 1) / D).sum(-1).mean())


# the arms of the experiment: name -> (registered loss, keyword arguments)
ARMS = {
    "GRPO (token)": ("vanilla", {}),
    "Turn-GRPO": ("turn_ppo", {"normalizer": "none"}),
    "token + norm": ("turn_ppo", {"level": "token", "normalizer": "bias"}),
    "SO-GRPO (turn + norm)": ("sorl", {}),
    "no clip": ("pg", {}),
}


def train_stale_lock(arm: str, staleness: int, cfg: LockConfig, seed: int) -> dict:
    """Train the tabular lock policy for ``cfg.steps`` steps from batches played by the policy of
    ``staleness`` steps ago, with the arm's registered loss and group-normalised returns (GRPO).

    Returns per-step arrays: ``reward`` (exact expected return of the current policy), ``clipfrac``
    (share of tokens whose ratio is outside ``[1 - eps, 1 + eps]`` at the level the arm clips, first
    epoch of each batch), ``grad_norm`` (largest over the epochs)."""
    loss_name, kw = ARMS[arm]
    fn = get_policy_loss(loss_name)
    codes = make_codes(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.zeros(cfg.contexts, cfg.doors, cfg.turn_len, cfg.symbols, requires_grad=True)
    kept: list = []
    out = {"reward": [], "clipfrac": [], "grad_norm": []}
    for _ in range(cfg.steps):
        behaviour = push_lagged(kept, logits, staleness)
        ep = play_lock(behaviour, codes, cfg, gen)
        r = ep["reward"].view(cfg.contexts, cfg.samples)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
        mask = ep["response_mask"]
        adv = adv * mask
        old = lock_log_probs(behaviour, ep)
        extra = {"turn_index": ep["turn_index"]} if loss_name in ("turn_ppo", "sorl") else {}
        clip_args = {} if loss_name == "pg" else {"clip_ratio_low": cfg.eps, "clip_ratio_high": cfg.eps}
        norms, first = [], None
        for epoch in range(cfg.epochs):
            logp = lock_log_probs(logits, ep)
            value, metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                                **clip_args, **extra, **kw)
            grad, = torch.autograd.grad(value, logits)
            if not torch.isfinite(grad).all():
                raise FloatingPointError(f"{arm}: non-finite gradient at staleness {staleness}")
            if epoch == 0:
                with torch.no_grad():
                    level = kw.get("level", "turn") if loss_name in ("turn_ppo", "sorl") else "token"
                    lr_ = level_log_ratio(logp - old, mask, ep["turn_index"], level)
                    first = float(masked_mean((lr_.abs() > np.log1p(cfg.eps)).float(), mask))
            with torch.no_grad():
                logits -= cfg.lr * grad
            norms.append(float(grad.norm()))
        out["reward"].append(expected_lock_return(logits, codes, cfg))
        out["clipfrac"].append(first)
        out["grad_norm"].append(max(norms))
    return {k: np.asarray(v) for k, v in out.items()}


def summarise(run: dict, tail: float = 0.2) -> dict:
    """Per-run summaries: ``final`` (mean reward over the last ``tail`` of training), ``peak``,
    ``collapsed`` (final below half the peak, the collapse rule fixed before the runs), ``clipfrac`` and ``grad_norm``
    (means over training), ``grad_max`` (largest gradient norm)."""
    r = run["reward"]
    k = max(1, int(len(r) * tail))
    final, peak = float(r[-k:].mean()), float(r.max())
    return {"final": final, "peak": peak, "collapsed": float(final < 0.5 * peak), "clipfrac": float(run["clipfrac"].mean()),
            "grad_norm": float(run["grad_norm"].mean()), "grad_max": float(run["grad_norm"].max())}


MODULES = ("rlcourse.methods.sorl", "rlcourse.losses", "rlcourse.snapshots", "rlcourse.ops")


def lock_arm(arm: str, staleness: int, lr: float | None = None) -> str:
    """The name of the grid's arm that trains ``arm`` of :data:`ARMS` at ``staleness`` (and, in the
    learning-rate sweep, at SGD learning rate ``lr``)."""
    return f"{arm} @ L={staleness}" + ("" if lr is None else f", lr={lr!r}")


def run_lock_cell(arm: str, seed: int, sizes: dict) -> dict:
    """:func:`train_stale_lock` for arm ``arm`` of ``sizes["arms"]`` (``{name: [loss arm, staleness,
    lr]}``) from ``seed``, with ``sizes["config"]`` at that lr (``T`` steps).

    ======================  ========  ==========================================
    reward                  ``(T,)``  exact expected return after each step
    clipfrac, grad_norm     ``(T,)``  as :func:`train_stale_lock` returns them
    summary                 dict      :func:`summarise`'s scalars
    ======================  ========  ==========================================
    """
    if arm not in sizes["arms"]:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(sizes['arms'])}")
    loss_arm, staleness, lr = sizes["arms"][arm]
    with one_torch_thread():
        run = train_stale_lock(loss_arm, staleness, LockConfig(**{**sizes["config"], "lr": lr}), seed)
    return {**{k: v.tolist() for k, v in run.items()}, "summary": summarise(run)}


def staleness_study(P: Profile, stalenesses=None, arms=None, seeds: int | None = None,
                    cfg: LockConfig | None = None) -> Study:
    """Every arm of ``arms`` (default :data:`ARMS`) at every staleness (default: the profile's) on
    seeds ``0 .. seeds - 1`` (default ``P.toy_seeds``), each arm at every staleness one arm of the grid
    (:func:`lock_arm`); only the default arms get :func:`study_verdicts`."""
    cfg = cfg or LockConfig(steps=P.pick(smoke=20, book=100))
    stalenesses = tuple(stalenesses or P.pick(smoke=(0, 4), book=(0, 4, 8)))
    table = {lock_arm(a, L): [a, L, cfg.lr] for a in tuple(arms or ARMS) for L in stalenesses}
    return Study(name="sorl-staleness", arms=tuple(table), seeds=tuple(range(seeds or P.toy_seeds)),
                 run=run_lock_cell, sizes={"config": asdict(cfg), "arms": table},
                 verdicts=study_verdicts if arms is None else None, modules=MODULES)


def staleness_output(results: Results) -> dict:
    """The chapter's dict from a :func:`staleness_study`'s results (``n`` seeds, ``T`` steps).

    ===================  =========  ================================================
    curves[(arm, L)]     ``(n,T)``  expected returns
    summary[(arm, L)]    ``(n,)``   per field of :func:`summarise`
    config, ...          ...        the :class:`LockConfig`, stalenesses, arms, ``n``
    seconds              float      wall seconds of the grid's cells
    ===================  =========  ================================================
    """
    study = results.study
    grid = {tuple(study.sizes["arms"][name][:2]): name for name in study.arms}
    curves = {key: np.array(results.values(name, "reward")) for key, name in grid.items()}
    summary = {}
    for key, name in grid.items():
        sums = results.values(name, "summary")
        summary[key] = {k: np.array([s[k] for s in sums]) for k in sums[0]}
    return {"config": LockConfig(**study.sizes["config"]), "stalenesses": tuple(dict.fromkeys(L for _, L in grid)),
            "arms": tuple(dict.fromkeys(a for a, _ in grid)), "seeds": len(study.seeds), "curves": curves,
            "summary": summary, "seconds": results.wall_seconds}


def run_staleness_experiment(P: Profile, stalenesses=None, arms=None, seeds: int | None = None,
                             cfg: LockConfig | None = None, **run_kw) -> dict:
    """Every arm at every staleness over ``P.toy_seeds`` seeds: :func:`staleness_study` on the study
    runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as :func:`staleness_output`'s
    dict: ``curves[(arm, L)]`` ``(seeds, steps)`` expected returns and ``summary[(arm, L)][name]``
    ``(seeds,)`` arrays of :func:`summarise`'s fields, and ``seconds``."""
    return staleness_output(run_study(staleness_study(P, stalenesses, arms, seeds, cfg), **run_kw))


# ---------------------------------------------------------------------- the claims
SETTING = ("tabular softmax policy on a multi-turn code lock (8 contexts, 3 doors, 4-symbol codes over 2 symbols, "
           "6 turns, 16 episodes per context per step, group-normalised returns, so the arms are GRPO's forms); batches played by the policy of "
           "L steps ago, 4 SGD steps per batch (lr 100, no gradient clipping); epsilon = 0.2; normaliser 'bias' with "
           "lambda = 1 (a reconstruction)")
SO, TOKEN = "SO-GRPO (turn + norm)", "GRPO (token)"  # the arms the claims compare


COLLAPSE_DRAWDOWN = 0.5  # the collapse rule of summarise, fixed before the runs: final below half the peak


def claims(stalenesses) -> dict[str, Claim]:
    """The claims the chapter tests, keyed by short name. The paper's "prevents collapse" rests on a
    control that a collapse occurs (token-level GRPO's drawdown at the largest staleness exceeds
    :data:`COLLAPSE_DRAWDOWN`, the rule of :func:`summarise`); the others on the control that stale data hurt token-level GRPO."""
    hi, lo = max(stalenesses), min(stalenesses)
    common = dict(paper=PAPER, setting=SETTING, paper_number="QA benchmarks (not reproduced)")
    abstract = 'abstract ("prevent optimization collapse", "mitigate gradient variance")'
    final = f"expected return over the last fifth of training, staleness L = {hi}"
    stale_ctrl, collapse_ctrl = "sorl/control-staleness", "sorl/control-collapse"
    drawdown = f"relative drawdown 1 - final / peak of the expected return (final: last fifth of training), L = {hi}"
    return {
        "less-lost-to-clip": Claim(key="sorl/less-lost-to-clip", statement="SO-PPO/SO-GRPO (turn-level ratio and "
                                   "clipping-triggered normalisation) train better than token-level PPO/GRPO on "
                                   "stale multi-turn data (here: less of the return lost to the token clip)",
                                   source=abstract, metric=final, method=SO, baseline=TOKEN, kind="greater",
                                   control=stale_ctrl, **common),
        "turn-ratio-alone": Claim(key="sorl/turn-ratio-alone", statement="the turn-level ratio alone (no normaliser) "
                                  "recovers what the token clip loses on stale data", source="ours (separates the two "
                                  "parts of SORL)", metric=final, method="Turn-GRPO", baseline=TOKEN, kind="greater",
                                  role="course hypothesis", control=stale_ctrl, **common),
        "normaliser-adds": Claim(key="sorl/normaliser-adds", statement="the clipping-triggered normalisation adds to "
                                 "the turn-level ratio (SO-GRPO above Turn-GRPO without it)", source="abstract (the "
                                 "method's second component)", metric=final, method=SO, baseline="Turn-GRPO",
                                 kind="greater", control=stale_ctrl, **common),
        "prevents-collapse": Claim(key="sorl/prevents-collapse", statement="SO-PPO/SO-GRPO prevent the performance "
                                   "collapse that token-level PPO/GRPO shows in off-policy multi-turn training",
                                   source=abstract, metric=drawdown, method=SO, baseline=TOKEN, kind="less",
                                   control=collapse_ctrl, **common),
        "lower-clip": Claim(key="sorl/lower-clip", statement="SORL keeps lower clipping ratios than token-level "
                            "PPO/GRPO (mechanical here: a turn's ratio averages its tokens' log-ratios)",
                            source="secondary summaries (not in the abstract, which says 'more conservative' updates)",
                            metric=f"share of tokens whose ratio leaves [1 - eps, 1 + eps] (first epoch), L = {hi}",
                            method=SO, baseline=TOKEN, kind="less", role="course hypothesis", **common),
        "lower-grad": Claim(key="sorl/lower-grad", statement="SORL mitigates gradient variance (conservative, robust "
                            "updates)", source=abstract,
                            metric=f"mean over training of the largest per-batch gradient norm, L = {hi}",
                            method=SO, baseline=TOKEN, kind="less", control=stale_ctrl, **common),
        "on-policy-match": Claim(key="sorl/on-policy-match", statement="SO-GRPO matches token-level GRPO's performance "
                                 "(within 0.05 of the return) when the data are fresh",
                                 source="ours: the abstract does not say it; a check that the normaliser costs nothing "
                                 "when there is no staleness",
                                 metric=f"expected return over the last fifth of training, L = {lo}",
                                 method=SO, baseline=TOKEN, kind="equivalent", margin=0.05, role="course hypothesis",
                                 **common),
        "control-staleness": Claim(key="sorl/control-staleness", role="positive control", statement="(control) stale data hurt "
                                   "token-level GRPO on this testbed, so there is a loss to recover",
                                   source="ours (a positive control)",
                                   metric=f"token-level GRPO's expected return over the last fifth, L = {lo} against L = {hi}",
                                   method=f"GRPO at L = {lo}", baseline=f"GRPO at L = {hi}", kind="greater", **common),
        "control-collapse": Claim(key="sorl/control-collapse", role="positive control", statement="(control) token-level GRPO "
                                  "collapses on stale data: its final return is below half its peak (relative drawdown "
                                  f"above {COLLAPSE_DRAWDOWN})", source="ours (a positive control for the collapse claim)", metric=drawdown,
                                  method=TOKEN, baseline=None, reference=0.0, margin=COLLAPSE_DRAWDOWN,
                                  kind="greater", **common),
    }


def staleness_verdicts(out: dict) -> dict[str, Verdict]:
    """Evaluate :func:`claims` on :func:`run_staleness_experiment`'s output."""
    ls = out["stalenesses"]
    hi, lo = max(ls), min(ls)
    c, s, S = claims(ls), out["seconds"], out["summary"]
    drop = {arm: 1.0 - S[(arm, hi)]["final"] / S[(arm, hi)]["peak"] for arm in (SO, TOKEN)}
    v = {"control-staleness": evaluate(c["control-staleness"], S[(TOKEN, lo)]["final"], S[(TOKEN, hi)]["final"],
                                       seconds=s),
         "control-collapse": evaluate(c["control-collapse"], drop[TOKEN], seconds=s)}
    st, co = {"control": v["control-staleness"]}, {"control": v["control-collapse"]}
    v.update({
        "less-lost-to-clip": evaluate(c["less-lost-to-clip"], S[(SO, hi)]["final"], S[(TOKEN, hi)]["final"],
                                      seconds=s, **st),
        "turn-ratio-alone": evaluate(c["turn-ratio-alone"], S[("Turn-GRPO", hi)]["final"], S[(TOKEN, hi)]["final"],
                                     seconds=s, **st),
        "normaliser-adds": evaluate(c["normaliser-adds"], S[(SO, hi)]["final"], S[("Turn-GRPO", hi)]["final"],
                                    seconds=s, **st),
        "prevents-collapse": evaluate(c["prevents-collapse"], drop[SO], drop[TOKEN], seconds=s, **co),
        "lower-clip": evaluate(c["lower-clip"], S[(SO, hi)]["clipfrac"], S[(TOKEN, hi)]["clipfrac"], seconds=s),
        "lower-grad": evaluate(c["lower-grad"], S[(SO, hi)]["grad_norm"], S[(TOKEN, hi)]["grad_norm"], seconds=s,
                               **st),
        "on-policy-match": evaluate(c["on-policy-match"], S[(SO, lo)]["final"], S[(TOKEN, lo)]["final"], seconds=s)})
    return v


def study_verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`staleness_verdicts` on a :func:`staleness_study`'s results (the grid's seconds only)."""
    return staleness_verdicts(staleness_output(results))


TUNING_SEEDS = (100, 101, 102)  # the learning-rate sweep's seeds, disjoint from the reported 0, 1, ...


def learning_rate_study(P: Profile, lrs=(30.0, 100.0, 300.0), staleness: int | None = None,
                        seeds: int | None = None) -> Study:
    """Token-level GRPO and SO-GRPO at staleness 0 and ``staleness`` (default: the profile's) at each
    SGD learning rate of ``lrs``, on the first ``seeds`` of :data:`TUNING_SEEDS`, fewer steps than the
    main run."""
    L = staleness if staleness is not None else P.pick(smoke=4, book=8)
    n = seeds or P.pick(smoke=1, book=3)
    if n > len(TUNING_SEEDS):
        raise ValueError(f"the sweep has {len(TUNING_SEEDS)} tuning seeds, asked for {n}")
    cfg = LockConfig(steps=P.pick(smoke=10, book=60))
    table = {lock_arm(arm, lag, lr): [arm, lag, lr] for lr in lrs for arm in (TOKEN, SO) for lag in (0, L)}
    return Study(name="sorl-lr-sweep", arms=tuple(table), seeds=TUNING_SEEDS[:n], run=run_lock_cell,
                 sizes={"config": asdict(cfg), "arms": table, "lrs": list(lrs), "staleness": L}, modules=MODULES)


def run_learning_rate_sweep(P: Profile, lrs=(30.0, 100.0, 300.0), staleness: int | None = None,
                            seeds: int | None = None, **run_kw) -> dict:
    """Final return of token-level GRPO and SO-GRPO at staleness 0 and ``staleness`` for several SGD
    learning rates (fewer steps than the main run), on :data:`TUNING_SEEDS` (disjoint from the reported
    seeds): where does staleness hurt at all? :func:`learning_rate_study` on the study runner
    (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`); ``final[(lr, arm, L)]`` is the
    mean over seeds of :func:`summarise`'s ``final``."""
    res = run_study(learning_rate_study(P, lrs, staleness, seeds), **run_kw)
    sz = res.study.sizes
    final = {(lr, arm, lag): float(np.mean([s["final"] for s in res.values(name, "summary")]))
             for name, (arm, lag, lr) in sz["arms"].items()}
    return {"lrs": tuple(lrs), "staleness": sz["staleness"], "seeds": len(res.study.seeds),
            "steps": sz["config"]["steps"], "final": final}


# ---------------------------------------------------------------------- the tiny LM on the text FrozenLake
def expert_episode_examples(n: int, seed: int = 0) -> list:
    """``frozenlake`` examples whose ``solution`` is a whole expert episode (moves, ``<eos>`` and the
    environment's replies), for a supervised warm start of the tiny LM."""
    from ..envs import TextFrozenLake, expert_transcript
    from ..tasks import Example, get_task

    out = []
    for e in get_task("frozenlake").examples(n, seed=seed):
        env = TextFrozenLake(size=e.meta["size"], max_turns=e.meta["max_turns"])
        obs, _ = env.reset(options={"map_seed": e.meta["map_seed"]})
        agent, replies = expert_transcript(env.desc, obs)
        text = "".join(a + r for a, r in zip(agent, replies))
        out.append(Example(e.prompt, e.answer, text[:-len("<eos>")], e.meta))  # sft() appends the last EOS
    return out


def run_lm_demo(P: Profile, losses=("vanilla", "sorl"), lag: int | None = None, seed: int = 0,
                lr: float = 1e-3) -> dict:
    """The registered parts in the Trainer: a smoke-sized tiny LM, warm-started on expert episodes, then
    trained on the text FrozenLake with the ``multiturn`` sampler ``lag`` steps behind and each loss of
    ``losses`` (one seed: a demonstration, not a verdict). Returns each loss's history and the seconds."""
    import copy

    from .. import profile as get_profile
    from ..lm import build_model, build_tokenizer
    from ..tasks import get_task
    from ..train import RLConfig, Trainer, sft

    lag = P.pick(smoke=1, book=4) if lag is None else lag
    start = time.perf_counter()
    tok = build_tokenizer()
    with one_torch_thread():
        base = build_model(tok, get_profile("smoke"), seed=seed)
        sft(base, tok, expert_episode_examples(1000, seed=seed), steps=P.pick(smoke=20, book=200), batch_size=32,
            lr=3e-3, seed=seed)
        task = get_task("frozenlake")
        train, held = task.examples(P.pick(smoke=50, book=1000), seed=seed + 1), task.examples(8, seed=0, split="test")
        histories = {}
        for loss in losses:
            cfg = RLConfig(num_generations=P.pick(smoke=2, book=8), prompts_per_step=P.pick(smoke=2, book=8),
                           steps=P.pick(smoke=2, book=30), learning_rate=lr, sampler="multiturn",
                           sampler_kwargs={"lag": lag}, policy_loss=loss, num_iterations=2, progress=False, seed=seed)
            histories[loss] = Trainer(copy.deepcopy(base), tok, task, cfg, train_examples=train,
                                      eval_examples=held).train()
    return {"histories": histories, "lag": lag, "seconds": time.perf_counter() - start}
