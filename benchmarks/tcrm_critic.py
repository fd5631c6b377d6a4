"""PPO step time and model-state memory: TCRM's reward model as the critic (unified) against a
separately trained critic, at a size larger than the chapter's.

    python benchmarks/tcrm_critic.py [--hidden 128 --layers 3 --steps 12 --rounds 2]

Both arms score with the same reward model (its weights untrained here: the cost of a step does not
depend on them) and run the same PPO steps on ``dyck_walk``; the unified arm reads its critic from
the reward model's forward pass (``tcrm_gae``), the other builds a critic from the policy and trains
it (``gae``). Prints the median step seconds and the bytes of model state (weights, gradients,
AdamW moments) of each arm; exits non-zero unless the unified arm is cheaper on both. Peak
activation memory is not measured (CPU).
"""
import argparse
import copy
import dataclasses
import json
import sys

import numpy as np
import torch

import rlcourse
from rlcourse.lm import build_tokenizer
from rlcourse.methods import tcrm as T
from rlcourse.studies import tcrm as study
from rlcourse.train import RLConfig, Trainer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two arms")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    prof = dataclasses.replace(rlcourse.profile("book"), lm_hidden=args.hidden, lm_intermediate=3 * args.hidden,
                               lm_layers=args.layers, lm_heads=4)
    tok = build_tokenizer()
    from rlcourse.lm.model import build_model
    from rlcourse.lm.heads import ScalarHeadModel
    policy = build_model(tok, prof, seed=0)
    name = T.use_reward_model("bench_rm", ScalarHeadModel.from_policy(build_model(tok, prof, seed=1)))
    arms = {"separate critic": dict(advantage_estimator="gae"),
            "unified": dict(advantage_estimator="tcrm_gae", advantage_kwargs={"reward_model": name})}
    times = {a: [] for a in arms}
    state = {}
    for r in range(args.rounds):
        for arm, parts in arms.items():
            cfg = RLConfig(num_generations=4, prompts_per_step=args.prompts, max_completion_length=T.WALK_LENGTH + 1,
                           steps=args.steps, reward="tcrm_score", reward_kwargs={"reward_model": name},
                           whiten_advantages=True, progress=False, seed=r, learning_rate=1e-4, **parts)
            tr = Trainer(copy.deepcopy(policy), tok, "dyck_walk", cfg, eval_examples=study.test_prompts())
            tr.train()
            times[arm] += [h["step_seconds"] for h in tr.history[1:]]
            state[arm] = study.state_bytes(tr)
    out = {arm: {"median_step_seconds": float(np.median(times[arm])), "state_bytes": state[arm]} for arm in arms}
    rel_t = out["unified"]["median_step_seconds"] / out["separate critic"]["median_step_seconds"] - 1
    rel_m = out["unified"]["state_bytes"]["total"] / out["separate critic"]["state_bytes"]["total"] - 1
    out["relative"] = {"step_time": rel_t, "model_state": rel_m}
    print(json.dumps(out, indent=1))
    print(f"unified vs separate critic: step time {rel_t:+.1%}, model state {rel_m:+.1%} "
          "(paper: -19% step time, -27% peak GPU memory); target: both below 0")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0 if rel_t < 0 and rel_m < 0 else 1


if __name__ == "__main__":
    sys.exit(main())
