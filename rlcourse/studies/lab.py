"""The lab chapter's study: pre-training curves of the tiny language model on each synthetic task.

One grid on the one runner (:func:`rlcourse.studies.runner.run_study`): the arms are the tasks
(:data:`TASKS`), the seed is 0, and a cell (:func:`run_cell`) builds the tokenizer and a fresh model
and runs :func:`rlcourse.lm.zoo.pretrain` on its task for a fixed number of steps, from the same initial
weights and with the same optimiser for every task. :func:`pretraining_curves` gives the chapter its
curves.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..profiles import Profile, one_torch_thread
from ..profiles import profile as get_profile
from .runner import Study, run_study

TASKS = ("sort", "addition", "countdown")
MODEL_SIZES = ("lm_hidden", "lm_intermediate", "lm_layers", "lm_heads", "lm_max_positions")
MODULES = ("rlcourse.lm.zoo", "rlcourse.lm.model", "rlcourse.lm.tokenizer", "rlcourse.lm.sampling",
           "rlcourse.tasks")


def sizes_for(prof: Profile) -> dict:
    """The pre-training budget (steps, batch, learning rate, evaluation) and the model sizes of ``prof``."""
    return {"steps": prof.pick(smoke=20, book=500, full=2000), "batch": prof.pretrain_batch,
            "lr": prof.pretrain_lr, "eval_every": prof.eval_every, "eval_prompts": prof.eval_prompts,
            "model": {k: getattr(prof, k) for k in MODEL_SIZES}}


def run_cell(arm: str, seed: int, sizes: dict) -> dict:
    """Pre-train a fresh model (initialised from ``seed``) on task ``arm`` for ``sizes["steps"]`` steps
    (``E`` evaluations, the first before training).

    ========  ==========  ===========================================================
    history   ``E`` rows  ``step``, ``loss`` (``None`` at step 0), held-out ``accuracy``
    accuracy  float       held-out greedy accuracy at the end
    seconds   float       the pre-training's wall seconds
    ========  ==========  ===========================================================
    """
    from ..lm import build_model, build_tokenizer, pretrain

    if arm not in TASKS:
        raise ValueError(f"unknown arm {arm!r}; the arms are {TASKS}")
    with one_torch_thread():
        tok = build_tokenizer()
        torch.manual_seed(seed)
        model = build_model(tok, SimpleNamespace(**sizes["model"]), seed=seed)  # reads only the model sizes
        res = pretrain(model, tok, arm, max_steps=sizes["steps"], batch_size=sizes["batch"], lr=sizes["lr"],
                       eval_every=sizes["eval_every"], eval_prompts=sizes["eval_prompts"], seed=seed, progress=False)
    return {"history": res.history, "accuracy": res.accuracy, "seconds": res.seconds}


def pretraining_study(prof: Profile) -> Study:
    """Every task of :data:`TASKS` on seed 0."""
    return Study(name="lab-pretraining", arms=TASKS, seeds=(0,), run=run_cell, sizes=sizes_for(prof),
                 modules=MODULES)


def pretraining_curves(prof: Profile | None = None, **run_kw) -> dict:
    """:func:`pretraining_study` on the study runner (``run_kw`` go to
    :func:`~rlcourse.studies.runner.run_study`), by task.

    ============= ======= ==============================================
    steps         int     pre-training steps of every run
    curves[task]  list    :func:`run_cell`'s ``history``
    accuracy      dict    task -> held-out greedy accuracy at the end
    seconds       dict    task -> pre-training wall seconds
    ============= ======= ==============================================
    """
    res = run_study(pretraining_study(prof or get_profile()), **run_kw)
    cell = {task: res.metrics[(task, 0)] for task in TASKS}
    return {"steps": res.study.sizes["steps"], "curves": {t: c["history"] for t, c in cell.items()},
            "accuracy": {t: c["accuracy"] for t, c in cell.items()}, "seconds": {t: c["seconds"] for t, c in cell.items()}}
