"""What the two benchmarks against TRL share: TRL's GRPOTrainer configured like rlcourse's run, and
a callback that times its steps."""
from __future__ import annotations

import tempfile
import time


def step_timer():
    """A ``transformers`` callback recording the seconds of each training step in ``.times``."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.t = [], None

        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t)

    return StepTimer()


def grpo_config(prompts: int, generations: int, max_completion_length: int, lr: float, steps: int,
                gradient_checkpointing: bool = False):
    """TRL's ``GRPOConfig`` for the comparison: one generation per step, one pass, ``beta = 0``,
    ``loss_type="dapo"``, constant learning rate, no weight decay, gradient clipping at 1, on the CPU.
    ``gradient_checkpointing`` is set explicitly (TRL's ``GRPOConfig`` turns it on by default, which
    re-runs the forward pass in the update); the rlcourse side must be given the same setting."""
    import trl

    return trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=prompts * generations,
        num_generations=generations, max_completion_length=max_completion_length,
        learning_rate=lr, max_steps=steps, beta=0.0, temperature=1.0, loss_type="dapo",
        logging_steps=10_000, save_strategy="no", report_to=[], use_cpu=True, bf16=False, fp16=False,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, shuffle_dataset=False,
        dataloader_num_workers=0, max_grad_norm=1.0, weight_decay=0.0, lr_scheduler_type="constant",
        warmup_steps=0, disable_tqdm=True, gradient_checkpointing=gradient_checkpointing,
    )


def rlcourse_config(prompts: int, generations: int, max_completion_length: int, lr: float, steps: int):
    """rlcourse's ``RLConfig`` with the settings of :func:`grpo_config`."""
    from rlcourse.train import RLConfig

    return RLConfig(num_generations=generations, prompts_per_step=prompts, max_completion_length=max_completion_length,
                    learning_rate=lr, steps=steps, beta=0.0, temperature=1.0, loss_type="dapo", max_grad_norm=1.0,
                    progress=False)


def alternate(trl_times, our_times, rounds: int) -> dict:
    """Run ``rounds`` of TRL then rlcourse; medians of TRL's step seconds, of rlcourse's, of its stages."""
    import statistics

    trl_all, hist = [], []
    for _ in range(rounds):
        trl_all += trl_times()
        hist += our_times()
    trl_step = statistics.median(trl_all)
    our_step = statistics.median([m["step_seconds"] for m in hist])
    stages = {key: statistics.median([m[key] for m in hist]) for key in ("time_rollout", "time_update")}
    return {"trl": trl_step, "ours": our_step, "ratio": our_step / trl_step, "stages": stages, "history": hist}
