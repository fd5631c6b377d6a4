"""The Thinking Seeds chapter's language-model study: GRPO, sequence-level mixing
(``"bank_sequence_mix"``) and Thinking Seeds (``"soup_prefix"``, :mod:`rlcourse.methods.soup`) trained
from the same ``addition`` base model on two-digit addition; then the paper's claims and their verdicts.

The arms are :data:`ARMS`, the seeds the profile's (one in smoke), and one cell loads the profile's base
model, seeds torch's global generator with its seed and trains one policy (:func:`run_cell`), so a
cell's numbers do not depend on which cells ran before it. :func:`run_soup_experiment` runs the grid on
the study runner (cached per cell), adds the base model's pass@k (:func:`base_passk`) and rebuilds the
dict the chapter reads; :func:`soup_verdicts` evaluates :data:`LM_CLAIMS` on it.

Also here: the exact gradient bias of token-level ratios on the tabular three-token model over random
instances (:func:`bias_experiment`) and its claim (:func:`bias_verdict`).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..claims import Claim, Verdict, evaluate
from ..methods.soup import PAPER, SEQS, T3, ascent_trajectory, bias_bound, expected_gradient
from ..profiles import Profile, one_torch_thread
from .runner import Results, Study, run_study

ARMS = {"GRPO": "policy", "sequence mixing": "bank_sequence_mix", "Thinking Seeds": "soup_prefix"}
MODULES = ("rlcourse.methods.soup", "rlcourse.bank", "rlcourse.train", "rlcourse.testtime")


def experiment_sizes(prof: Profile) -> dict:
    """The experiment's sizes: the bank keeps a snapshot every 5 steps, at most 2, and the oldest
    writes (a lag of 5 to 9 steps once it is full)."""
    return prof.pick(
        smoke=dict(steps=3, prompts_per_step=4, num_generations=4, eval_prompts=8, n=4, ks=[1, 2, 4],
                   seeds=[0], lr=1e-4, every=1, max_snapshots=2),
        book=dict(steps=40, prompts_per_step=16, num_generations=8, eval_prompts=64, n=16, ks=[1, 2, 4, 8, 16],
                  seeds=list(range(prof.seeds)), lr=1e-4, every=5, max_snapshots=2))


CURVES = ("passk", "held_entropy", "entropy", "clipfrac", "reward", "bank_share", "log_ratio")


def held_out_entropy(model, tokenizer, examples, seed: int, n: int = 4) -> float:
    """Mean token entropy of ``model``'s own samples (``n`` per prompt, temperature 1) on ``examples``:
    the policy's effective entropy where every arm is measured alike."""
    from ..lm.sampling import sample

    b = sample(model, tokenizer, [e.prompt for e in examples], num_generations=n, max_new_tokens=10,
               generator=torch.Generator().manual_seed(10_000 + seed))
    return float(b.entropy.sum() / b.response_mask.sum())


def _base_and_held(sizes: dict):
    """The profile's ``addition`` base model, its tokenizer, the task and the held-out prompts."""
    from ..lm.zoo import load_base_model
    from ..tasks import get_task

    base, tok = load_base_model("addition", "medium", prof=Profile(**sizes["profile"]), progress=False)
    task = get_task("addition")
    return base, tok, task, task.examples(sizes["eval_prompts"], seed=2000, split="test")


def base_passk(sizes: dict) -> list:
    """``(K,)``: the base model's pass@k on the held-out prompts (``n`` samples each, temperature 1)."""
    from ..testtime import evaluate_samples, pass_at_k_curve

    with one_torch_thread():
        base, tok, _, held = _base_and_held(sizes)
        ev = evaluate_samples(base, tok, held, sizes["n"], 10, torch.Generator().manual_seed(0))
    return pass_at_k_curve(ev["correct"], sizes["ks"]).tolist()


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train arm ``arm`` (a sampler of :data:`ARMS`) from the base model with ``seed``.

    ==============  ==========  ===================================================================
    passk           ``(K,)``    held-out pass@k for k in ``ks``
    held_entropy    scalar      mean token entropy of the trained policy's own held-out samples
    entropy, ...    ``(S,)``    per step: entropy, clipfrac, reward, bank_share, log_ratio
    ==============  ==========  ===================================================================
    """
    from ..testtime import evaluate_samples, pass_at_k_curve
    from ..train import RLConfig, Trainer

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {tuple(ARMS)}")
    z, sampler = sizes, ARMS[arm]
    with one_torch_thread():
        base, tok, task, held = _base_and_held(z)
        pool = task.examples(4000, seed=seed, split="train")
        torch.manual_seed(seed)
        kw = {} if sampler == "policy" else {"every": z["every"], "max_snapshots": z["max_snapshots"]}
        cfg = RLConfig(num_generations=z["num_generations"], prompts_per_step=z["prompts_per_step"],
                       max_completion_length=10, steps=z["steps"], learning_rate=z["lr"], seed=seed,
                       progress=False, sampler=sampler, sampler_kwargs=kw)
        tr = Trainer(base, tok, task, cfg, train_examples=pool, eval_examples=held[:8])
        tr.train()
        ev = evaluate_samples(tr.model, tok, held, z["n"], 10, torch.Generator().manual_seed(1 + seed))
        h = tr.history
        return {"passk": pass_at_k_curve(ev["correct"], z["ks"]).tolist(),
                "held_entropy": held_out_entropy(tr.model, tok, held, seed),
                "entropy": [m["entropy"] for m in h], "clipfrac": [m.get("pg_clipfrac", 0.0) for m in h],
                "reward": [m["reward"] for m in h],
                # the bank samplers log their per-step measurements in the trainer's history (batch.metrics)
                "bank_share": [m.get("bank_token_share", 0.0) for m in h],
                "log_ratio": [m.get("bank_prefix_log_ratio", 0.0) for m in h]}


def soup_study(P: Profile) -> Study:
    """The chapter's grid: every arm of :data:`ARMS` on the seeds of :func:`experiment_sizes`."""
    z = experiment_sizes(P)
    return Study(name="thinking_seeds", arms=tuple(ARMS), seeds=tuple(z["seeds"]), run=run_cell,
                 sizes={**z, "profile": P.as_dict()},
                 verdicts=verdicts, modules=MODULES)


def experiment_output(results: Results, base: list | None = None) -> dict:
    """The chapter's dict from a :func:`soup_study`'s results (``N`` seeds, ``K`` values of k, ``S``
    steps), with the base model's pass@k ``base`` (default: :func:`base_passk`).

    ==================  ==========  ==============================================================
    passk[arm]          ``(N, K)``  pass@k for k in ``ks`` per seed
    base_passk          ``(K,)``    the base model's
    held_entropy[arm]   ``(N,)``    mean token entropy of the trained policy's own held-out samples
    entropy[arm]        ``(N, S)``  the current policy's mean token entropy at each step
    clipfrac[arm]       ``(N, S)``  PPO's clipped share of tokens at each step
    reward[arm]         ``(N, S)``  mean training reward at each step
    bank_share[arm]     ``(N, S)``  share of tokens written by the bank (0 for GRPO)
    log_ratio[arm]      ``(N, S)``  mean log pi_current - log pi_writer on bank tokens, at sampling
    ks, sizes, seeds    ...         the values of k, :func:`experiment_sizes`, the number of seeds
    seconds             float       wall seconds of the grid's cells (and of ``base_passk``)
    ==================  ==========  ==============================================================
    """
    study = results.study
    z = {k: v for k, v in study.sizes.items() if k != "profile"}
    base = base_passk(study.sizes) if base is None else base
    out = {"ks": z["ks"], "sizes": z, "base_passk": np.asarray(base, dtype=float)}
    for key in CURVES:
        out[key] = {arm: np.asarray(results.values(arm, key), dtype=float) for arm in study.arms}
    out["seeds"] = len(study.seeds)
    out["seconds"] = results.wall_seconds
    return out


def run_soup_experiment(prof: Profile, **run_kw) -> dict:
    """GRPO, sequence-level mixing and Thinking Seeds from the same ``addition`` base model, same
    optimiser, learning rate, steps and prompts, over paired seeds; after training, pass@k on
    held-out prompts (``n`` samples each, temperature 1) and the training curves: :func:`soup_study`
    on the study runner (``run_kw`` go to :func:`~rlcourse.studies.runner.run_study`), as
    :func:`experiment_output`'s dict."""
    study = soup_study(prof)
    t0 = time.perf_counter()
    base = base_passk(study.sizes)
    seconds = time.perf_counter() - t0
    out = experiment_output(run_study(study, **run_kw), base)
    out["seconds"] += seconds
    return out


_SETTING = ("tiny LM (0.6M) on 2-digit addition from the 'medium' base model; G = 8 (4 seeded), 16 prompts x 40 "
            "steps, AdamW lr 1e-4, PPO-clip 0.2, one pass per batch; bank: a snapshot every 5 steps, 2 kept, the "
            "oldest writes; prefixes 25-50% of the writer's response; 64 held-out prompts x 16 samples")


CONTROL_KEY = "thinking_seeds/control-grpo-learns"


def _claim(name, statement, metric, method, baseline, kind="greater", control=CONTROL_KEY):
    return Claim(key=f"thinking_seeds/lm-{name}", paper=PAPER, statement=statement, source="abstract",
                 setting=_SETTING, metric=metric, method=method, baseline=baseline, kind=kind, margin=0.0,
                 control=control)


_OUTPERFORMS = "Thinking Seeds consistently outperforms standard on-policy training and existing off-policy extensions"
LM_CLAIMS = {
    "vs-grpo": _claim("beats-grpo", _OUTPERFORMS, "held-out pass@1 after training", "Thinking Seeds", "GRPO"),
    "vs-sequence": _claim("beats-sequence-mixing", _OUTPERFORMS, "held-out pass@1 after training", "Thinking Seeds",
                          "sequence mixing"),
    "entropy": _claim("higher-entropy", "the method maintains higher effective entropy",
                      "mean token entropy of the trained policy's own samples on the held-out prompts",
                      "Thinking Seeds", "GRPO"),
    "clipping": _claim("less-clipping", "[the method] reduces gradient loss from clipping",
                       "share of clipped tokens, mean over training", "Thinking Seeds", "sequence mixing", kind="less",
                       control=None),
    "pass-at-k": _claim("expands-solution-space", "[the method] expands the explorable solution space",
                        "held-out pass@16 after training", "Thinking Seeds", "GRPO"),
    "control": Claim(key="thinking_seeds/control-grpo-learns", role="positive control", paper=PAPER,
                     statement="(control, not a claim of the paper) GRPO raises pass@1 over the base model",
                     source="positive control of the experiment", setting=_SETTING,
                     metric="held-out pass@1 after training", method="GRPO", baseline="base model",
                     kind="greater", margin=0.0),
}


def soup_verdicts(res: dict) -> dict[str, Verdict]:
    """The claims of :data:`LM_CLAIMS`, evaluated on :func:`run_soup_experiment`'s output. The
    performance claims rest on the control that GRPO learns at all (uninformative otherwise); the
    clipping claim, a count of clipped tokens, does not."""
    ks, s = list(res["ks"]), res["seconds"]
    p1, pk = ks.index(1), len(ks) - 1
    pa, ts, sq, gr = res["passk"], "Thinking Seeds", "sequence mixing", "GRPO"
    control = evaluate(LM_CLAIMS["control"], pa[gr][:, p1], np.full(res["seeds"], res["base_passk"][p1]), seconds=s)
    c = {"control": control}
    return {
        "vs-grpo": evaluate(LM_CLAIMS["vs-grpo"], pa[ts][:, p1], pa[gr][:, p1], seconds=s, **c),
        "vs-sequence": evaluate(LM_CLAIMS["vs-sequence"], pa[ts][:, p1], pa[sq][:, p1], seconds=s, **c),
        "entropy": evaluate(LM_CLAIMS["entropy"], res["held_entropy"][ts], res["held_entropy"][gr], seconds=s, **c),
        "clipping": evaluate(LM_CLAIMS["clipping"], res["clipfrac"][ts].mean(1), res["clipfrac"][sq].mean(1), seconds=s),
        "pass-at-k": evaluate(LM_CLAIMS["pass-at-k"], pa[ts][:, pk], pa[gr][:, pk], seconds=s, **c),
        "control": control,
    }


def verdicts(results: Results) -> dict[str, Verdict]:
    """:func:`soup_verdicts` on a :func:`soup_study`'s results."""
    return soup_verdicts(experiment_output(results))


# ---------------------------------------------------------------------- the tabular model's exact bias
def bias_experiment(prof: Profile) -> dict:
    """Relative bias ``||E[g] - grad J|| / ||grad J||`` of the token-level gradient against the lag of the
    historical policy, for prefix lengths 0 to 3 (3 = sequence-level mixing), on random instances
    (rewards ``U[0, 1]``, a fresh ascent trajectory each), plus the exact sequence-level correction and
    the proposition's bound. An exact computation over random instances, not a grid of seeded runs.

    ============ ================== =================================================
    lags         ``(L,)``           checkpoint lags (steps of the ascent)
    bias[cut]    ``(N, L)``         relative bias of token-level ratios, cut = 0..3
    seq_bias     ``(N, L)``         relative bias with the full prefix product (cut 3)
    bound_ok     bool               every bias below its bound (cut 1..3, every lag)
    ============ ================== =================================================
    """
    n = prof.pick(smoke=3, book=20)
    steps, lr = 30, 2.0
    lags = list(range(0, steps + 1, 3))
    t0 = time.perf_counter()
    bias = {cut: np.zeros((n, len(lags))) for cut in range(T3 + 1)}
    seq_bias = np.zeros((n, len(lags)))
    bound_ok = True
    for i in range(n):
        reward = np.random.default_rng(1000 + i).random(len(SEQS))
        traj = ascent_trajectory(reward, steps, lr, seed=i)
        cur = traj[-1]
        g = expected_gradient(cur, cur, reward, 0)
        for j, lag in enumerate(lags):
            hist = traj[steps - lag]
            for cut in range(T3 + 1):
                err = np.linalg.norm(expected_gradient(cur, hist, reward, cut) - g)
                bias[cut][i, j] = err / np.linalg.norm(g)
                if cut and err > bias_bound(cur, hist, reward, cut) + 1e-12:
                    bound_ok = False
            seq_bias[i, j] = np.linalg.norm(expected_gradient(cur, hist, reward, T3, "sequence") - g) / np.linalg.norm(g)
    return {"lags": np.array(lags), "bias": bias, "seq_bias": seq_bias, "bound_ok": bound_ok, "instances": n,
            "steps": steps, "lr": lr, "seconds": time.perf_counter() - t0}


TABULAR_LAG = 15  # the lag at which the tabular claim is read (half the ascent), fixed before the run

BIAS_CLAIM = Claim(
    key="thinking_seeds/prefix-bias-below-sequence", paper=PAPER,
    statement="existing methods mix entire trajectories at the sequence level, introducing severe policy mismatch "
              "... the critical continuation is generated on-policy to preserve gradient quality",
    source="abstract (the bias computation is the course's reconstruction)",
    setting=f"tabular 3-token LM (V = 3), exact expectations; current policy after 30 steps of exact ascent, the "
            f"historical one {TABULAR_LAG} steps behind",
    metric="relative bias of the token-level gradient, ||E g - grad J|| / ||grad J||",
    method="prefix of 1 token (Thinking Seeds)", baseline="whole sequence historical (sequence-level mixing)",
    kind="less", margin=0.0, replicate="instance")


def bias_verdict(res: dict) -> Verdict:
    """:data:`BIAS_CLAIM` at the lag :data:`TABULAR_LAG` on :func:`bias_experiment`'s instances."""
    j = int(np.searchsorted(res["lags"], TABULAR_LAG))
    return evaluate(BIAS_CLAIM, res["bias"][1][:, j], res["bias"][T3][:, j], seconds=res["seconds"])
