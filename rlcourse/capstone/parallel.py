"""The capstone's trainer on several processes, with torch's own engines doing the reduction.

:class:`ParallelTrainer` is the book's :class:`~rlcourse.train.Trainer` with its model handed to an
engine (:func:`rlcourse.distributed.engage`) once the optimiser exists and any checkpoint has been
loaded into the plain model:

========  ===========================================================================================
``ddp``   ``DistributedDataParallel`` around the model: each process holds everything; the training
          passes run through the wrapper, which sums the gradients bucket by bucket during backward
``fsdp``  ``fully_shard`` (FSDP2) on every decoder layer: each process holds a shard of the weights,
          gradients and optimiser state; sampling and the reference pass run on gathered weights
========  ===========================================================================================

In one process nothing is wrapped: it is the plain trainer. Checkpoints have the one-process layout
(a peft adapter folder, the optimiser keyed by index), whichever engine wrote them.
"""
from __future__ import annotations

import copy
import functools
from contextlib import nullcontext
from types import SimpleNamespace

from .. import checkpoints, distributed
from ..lm.model import response_logprobs
from ..lora import is_peft_model
from ..train import Trainer


class ParallelTrainer(Trainer):
    """:class:`~rlcourse.train.Trainer` under the engine ``parallel`` (``"ddp"`` or ``"fsdp"``, a key of
    :data:`rlcourse.distributed.PARALLEL`); the other arguments are the trainer's."""

    def __init__(self, model, tokenizer, task, config=None, *, parallel: str = "ddp", **kwargs):
        if parallel not in distributed.PARALLEL:
            raise ValueError(f"unknown parallel strategy {parallel!r}; choose one of {sorted(distributed.PARALLEL)}")
        super().__init__(model, tokenizer, task, config, **kwargs)  # a resume loads into the plain model
        if parallel == "fsdp" and self.output_dir is not None and not is_peft_model(self.model):
            raise ValueError("parallel='fsdp' checkpoints a LoRA adapter; a model without one cannot be saved "
                             "under it here: use parallel='ddp'")
        self.dp = distributed.engage(self.model, self.optimizer, parallel)
        if getattr(self.dp, "parallel", None) == "fsdp":  # sampling holds the gathered weights until the update
            self.sampler = _gathering(self.sampler, self.dp)

    def gathered(self):
        """A context in which the policy's full weights are on every process (FSDP; else nothing to do).
        Every process must enter it."""
        return self.dp.gathered() if isinstance(self.dp, distributed.Engine) else nullcontext()

    def _policy_logprobs(self, input_ids, attention_mask, prompt_len, index, rows, temperature, entropy):
        """The training passes run through the engine's module (the DDP wrapper, or the sharded model)."""
        if not isinstance(self.dp, distributed.Engine):
            return super()._policy_logprobs(input_ids, attention_mask, prompt_len, index, rows, temperature, entropy)
        return response_logprobs(self.dp.module, input_ids[rows], attention_mask[rows], input_ids.shape[1] - prompt_len,
                                 temperature, return_entropy=entropy)

    def evaluate(self, examples=None) -> float:
        with self.gathered():
            return super().evaluate(examples)

    def save_checkpoint(self):
        """The one-process checkpoint; under FSDP the adapter and the optimiser state are gathered
        whole first (every process takes part, rank 0 writes)."""
        if getattr(self.dp, "parallel", None) != "fsdp":
            return super().save_checkpoint()
        weights, optim = distributed.full_state(self.model, self.optimizer)
        view = copy.copy(self)
        view.model = SimpleNamespace(peft_config=self.model.peft_config, disable_adapter=self.model.disable_adapter,
                                     save_pretrained=functools.partial(self.model.save_pretrained, state_dict=weights))
        view.optimizer = SimpleNamespace(state_dict=lambda: optim)
        return checkpoints.save_checkpoint(view)


def _gathering(sampler, engine):
    """``sampler`` that first has ``engine`` gather the full weights (released when the update starts)."""
    @functools.wraps(sampler)
    def gathering_sampler(*args, **kwargs):
        engine.gather()
        return sampler(*args, **kwargs)
    return gathering_sampler
