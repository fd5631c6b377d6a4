"""The smallest study: a softmax policy on a 5-armed Bernoulli bandit, trained by REINFORCE with and
without a mean-reward baseline. It shows the shape every chapter's study has (arms, seeds, one pure
function per cell, one function from the grid to verdicts) and runs in milliseconds, so the runner's
tests execute it serially, over loky workers and on Ray."""
from __future__ import annotations

import numpy as np

from ..claims import Claim, evaluate
from .runner import Results, Study

ARMS = ("REINFORCE", "REINFORCE + baseline")
PROBS = np.array([0.2, 0.3, 0.4, 0.5, 0.8])


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Train one arm on one seed; return the expected reward of the final policy and its curve."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {ARMS}")
    rng = np.random.default_rng(seed)
    logits = np.zeros(len(PROBS))
    baseline, curve = 0.0, []
    for _ in range(sizes["steps"]):
        pi = np.exp(logits - logits.max())
        pi /= pi.sum()
        a = rng.choice(len(PROBS), size=sizes["batch"], p=pi)
        r = (rng.random(sizes["batch"]) < PROBS[a]).astype(float)
        b = baseline if arm == "REINFORCE + baseline" else 0.0
        grad = np.zeros_like(logits)
        for ai, ri in zip(a, r):
            g = -pi.copy()
            g[ai] += 1.0
            grad += (ri - b) * g
        logits += sizes["lr"] * grad / sizes["batch"]
        baseline = 0.9 * baseline + 0.1 * r.mean()
        curve.append(float(pi @ PROBS))
    return {"final": curve[-1], "curve": curve}


def study(seeds: int = 5, steps: int = 60, batch: int = 8, lr: float = 0.5) -> Study:
    """The demo study over ``seeds`` seeds."""
    return Study(name="demo", arms=ARMS, seeds=tuple(range(seeds)), run=run_cell,
                 sizes={"steps": steps, "batch": batch, "lr": lr}, verdicts=verdicts)


CLAIM = Claim(key="policy_gradients/study-baseline-helps", paper="Simple statistical gradient-following algorithms for connectionist "
              "reinforcement learning (Williams, 1992)", statement="a reward baseline reduces the variance of the "
              "policy gradient", source="section 4", setting="5-armed Bernoulli bandit, softmax policy",
              metric="expected reward of the final policy", method="REINFORCE + baseline", baseline="REINFORCE",
              kind="greater", margin=0.0, role="course hypothesis")


def verdicts(results: Results) -> dict:
    """The grid's one verdict: does the baseline end higher?"""
    return {"baseline-helps": evaluate(CLAIM, results.values("REINFORCE + baseline", "final"),
                                       results.values("REINFORCE", "final"), seconds=results.wall_seconds)}
