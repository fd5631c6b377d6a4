"""Softmax bandits: the policy gradient and KL control where every expectation can be enumerated.

A softmax bandit has ``K`` arms, a policy :math:`\\pi_\\theta = \\mathrm{softmax}(\\theta)` over them
and a reward whose mean given arm ``a`` is ``means[a]``. Because there are only ``K`` actions, the
exact gradient, the exact mean and variance of any per-sample estimator, and the KL-regularised
optimum are finite sums; Monte Carlo estimators can be checked against them. Three modules, one
family each, all importable from here:

========================================= ==================================================
:mod:`rlcourse.bandits.exact`             checks, exact quantities, Monte Carlo draws, the
                                          sequence bandit
:mod:`rlcourse.bandits.baselines`         REINFORCE with baselines: training runs and the
                                          experiment of the chapter *Policy gradients*
:mod:`rlcourse.bandits.kl`                KL estimators, the regularised optimum, KL in the
                                          reward or the loss: the chapter *KL control* (its
                                          studies: :mod:`rlcourse.studies.kl_control`)
========================================= ==================================================
"""
from __future__ import annotations

from .exact import (DTYPE, expected_reward, exact_policy_gradient, score_vectors, optimal_baseline,
                    estimator_moments, sample_bandit, batch_baselines, reinforce_estimates,
                    enumerate_sequences, markov_token_scores, sequence_estimator_moments)
from .baselines import (BASELINES, train_bandit, baseline_bandit, run_baseline_experiment, PG_CLAIMS,
                        pg_verdicts)
from .kl import (KL_PLACEMENTS, kl_categorical, kl_estimator_moments, kl_regularised_optimum,
                 regularised_objective, exact_ascent, expected_loss_ascent, train_kl_bandit, kl_bandit)
from ..profiles import one_torch_thread  # noqa: F401  (the chapters import it from here, as before the split)
