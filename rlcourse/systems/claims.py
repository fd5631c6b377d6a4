"""The JigsawRL chapter's claims, and their verdicts from the simulated sweeps (NumPy only).

JigsawRL's abstract (Pipeline Multiplexing for RL post-training, arXiv abstract in the course's seed
file) reports "up to 1.85x throughput over Verl on synchronous RL" on 4-64 GPUs, from multiplexing
pipelines over a sub-stage graph, "migrating long-tail rollouts across workers" and a look-ahead
scheduler. We test the direction of both parts in the simulator, paired by seed (each seed is one set
of length draws shared by all schedulers), at the sweep's tail weight ``sigma = 1``:

========================  ================================================================  ======
claim                     method vs baseline (per seed)                                     kind
========================  ================================================================  ======
``gain``                  look-ahead throughput / stage-level throughput vs 1               greater
``migration``             look-ahead gain vs multiplexing-alone gain                        greater
``gain-measured``         ``gain`` with stage costs measured on rlcourse's loop              greater
``gain-own-lengths``      ``gain`` with measured costs on the tiny LM's own lengths          greater
========================  ================================================================  ======

The margins are 0: the abstract claims a gain, and its 1.85x is a maximum over its setups ("up to"),
not a level every setup must reach, so it is reported beside our effect (``paper_number``) rather
than used as a threshold. The sweep over ``sigma`` is the control of the last claim: with the same
measured costs it shows where the gain appears, so a verdict on the model's own (light-tailed)
lengths is a statement about the lengths, not about an experiment that could not see a gain.
"""
from __future__ import annotations

import numpy as np

from ..claims import Claim, Verdict, evaluate

PAPER = ("JigsawRL: pipeline multiplexing for RL post-training (JigsawRL authors, 2026; arXiv abstract as in "
         "the course's seed file)")
_STATEMENT = ("On 4-64 H100/A100 GPUs across different agentic RL pipelines and models, JigsawRL achieves up "
              "to 1.85x throughput over Verl on synchronous RL")
_MIGRATION = ("JigsawRL ... eliminates fragmented utilization by migrating long-tail rollouts across workers, "
              "and formulates their coordination as a graph scheduling problem solved with a look-ahead heuristic")
_SIM = ("discrete-event simulator, 3 pipelines x 3 synchronous iterations x 128 sequences on 4 workers, "
        "log-normal rollout lengths (mean 256, sigma = 1)")

CLAIMS = {
    "gain": Claim(
        key="jigsawrl/gain", paper=PAPER, statement=_STATEMENT, source="abstract", paper_number="up to 1.85x",
        setting=_SIM + ", synthetic GPU-like stage costs", metric="throughput of the look-ahead scheduler over "
        "the stage-level (verl-like) scheduler's, per seed", method="look-ahead (multiplexing + migration)",
        baseline=None, reference=1.0, kind="greater", margin=0.0, unit="{:.3f}"),
    "migration": Claim(
        key="jigsawrl/migration", paper=PAPER, statement=_MIGRATION, source="abstract", paper_number="",
        setting=_SIM + ", synthetic GPU-like stage costs", metric="throughput gain over the stage-level "
        "scheduler, per seed", method="look-ahead (multiplexing + migration)", baseline="multiplexing alone",
        kind="greater", margin=0.0, unit="{:.3f}"),
    "gain-measured": Claim(
        key="jigsawrl/gain-measured", paper=PAPER, statement=_STATEMENT, source="abstract",
        paper_number="up to 1.85x", setting=_SIM + ", stage costs measured on rlcourse's own loop (tiny LM, CPU)",
        metric="throughput of the look-ahead scheduler over the stage-level scheduler's, per seed",
        method="look-ahead (multiplexing + migration)", baseline=None, reference=1.0, kind="greater",
        margin=0.0, unit="{:.3f}"),
    "gain-own-lengths": Claim(
        key="jigsawrl/gain-own-lengths", paper=PAPER, statement=_STATEMENT, source="abstract",
        paper_number="up to 1.85x", setting="the same simulator and measured costs, on bootstrap draws of the "
        "tiny LM's own response lengths rescaled to mean 256", metric="throughput of the look-ahead scheduler "
        "over the stage-level scheduler's, per seed", method="look-ahead (multiplexing + migration)",
        baseline=None, reference=1.0, kind="greater", margin=0.0, unit="{:.3f}"),
}


def _at_sigma(sweep: dict, sigma: float) -> int:
    sigmas = np.asarray(sweep["sigmas"], dtype=float)
    i = int(np.argmin(np.abs(sigmas - sigma)))
    if abs(sigmas[i] - sigma) > 1e-9:
        raise ValueError(f"the sweep has no tail weight sigma = {sigma} (it has {sigmas.tolist()})")
    return i


def jigsaw_verdicts(sweep: dict, measured: dict | None = None, sigma: float = 1.0) -> dict[str, Verdict]:
    """Evaluate :data:`CLAIMS` on :func:`run_jigsaw_experiment`'s output (and, when given, on
    :func:`run_measured_jigsaw_experiment`'s), at tail weight ``sigma``.

    ========  ======  ==============================================================
    sweep     dict    ``gain[s]`` of shape ``(R, S)``, ``sigmas`` ``(S,)``, ``seconds``
    measured  dict    ``sweep`` (same layout, measured costs), ``own_gain[s]`` ``(R,)``
    returns   dict    claim name -> :class:`rlcourse.claims.Verdict`
    ========  ======  ==============================================================
    """
    i = _at_sigma(sweep, sigma)
    g = sweep["gain"]
    out = {
        "gain": evaluate(CLAIMS["gain"], g["lookahead"][:, i], seconds=sweep.get("seconds")),
        "migration": evaluate(CLAIMS["migration"], g["lookahead"][:, i], g["multiplex"][:, i],
                              seconds=sweep.get("seconds")),
    }
    if measured is not None:
        ms = measured["sweep"]
        j = _at_sigma(ms, sigma)
        out["gain-measured"] = evaluate(CLAIMS["gain-measured"], ms["gain"]["lookahead"][:, j],
                                        seconds=measured.get("seconds"))
        out["gain-own-lengths"] = evaluate(CLAIMS["gain-own-lengths"], measured["own_gain"]["lookahead"],
                                           seconds=measured.get("seconds"))
    return out
