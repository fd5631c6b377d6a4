"""A checkpoint bank: past policies kept every ``K`` steps with bounded memory, which write prefixes
that the current policy continues (token-level mixing, SOUP) or whole responses (sequence-level
mixing), with the true behaviour log-prob of every token recorded.

Everything the bank keeps is plain data in the sampler's ``state`` (``state["checkpoint_bank"]``):
the settings, the versions held and their weights as CPU state dicts (never models). The trainer
saves ``state`` with every checkpoint and restores it on resume, so a resumed run holds exactly the
snapshots the uninterrupted one held and samples the same rows. What each step did (the writer, the
share of tokens it wrote...) goes in ``batch.metrics``, which the trainer logs with the step.

A snapshot's *version* is the number of updates its weights had seen: the sampler of step ``k``
(1-based) runs before the ``k``-th update, so the current policy is version ``k - 1``, and the bank
stores it when ``(k - 1) % every == 0`` (version 0, the initial policy, is always stored first). At
most ``max_snapshots`` are kept; the oldest is dropped first.

================================ ==============================================================
:func:`bank_of`                  the bank in a sampler's state (created on first use)
:func:`take_snapshot`            store the current weights if this version is due
:func:`snapshot_weights`         the state dict of a held version (ValueError naming those held)
:func:`bank_policy`              a model carrying a held version's weights
:func:`choose_version`           which held version writes this step's prefixes
:func:`cut_points`               how many of the writer's tokens each seeded row keeps
:func:`bank_mixed_batch`         the whole sampler: on-policy rows, seeded rows, bookkeeping
================================ ==============================================================
"""
from __future__ import annotations

import copy
from dataclasses import replace
from typing import Sequence

import torch

from .lm.model import response_logprobs
from .lm.sampling import RolloutBatch, cat_batches, sample
from .snapshots import detached_copy

BANK_KEY = "checkpoint_bank"
CHOICES = ("oldest", "latest", "random")


def bank_of(state: dict, every: int, max_snapshots: int) -> dict:
    """The bank kept in ``state[BANK_KEY]``, created on first use; a bank already there with other
    settings is an error (a resumed run must keep the bank it saved)."""
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every (steps between snapshots) must be an integer >= 1, got {every!r}")
    if not isinstance(max_snapshots, int) or max_snapshots < 1:
        raise ValueError(f"max_snapshots must be an integer >= 1, got {max_snapshots!r}")
    bank = state.setdefault(BANK_KEY, {"every": every, "max_snapshots": max_snapshots, "versions": [],
                                       "weights": {}})
    if (bank["every"], bank["max_snapshots"]) != (every, max_snapshots):
        raise ValueError(f"the state holds a bank with every={bank['every']}, max_snapshots={bank['max_snapshots']}, "
                         f"not every={every}, max_snapshots={max_snapshots}")
    return bank


def take_snapshot(bank: dict, model: torch.nn.Module, version: int) -> bool:
    """Store ``model``'s weights as ``version`` if ``version % every == 0`` and it is not held yet;
    drop the oldest snapshots beyond ``max_snapshots``. Returns whether a snapshot was stored."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    if version % bank["every"] != 0 or version in bank["versions"]:
        return False
    if bank["versions"] and version < bank["versions"][-1]:
        raise ValueError(f"version {version} is older than the newest snapshot held ({bank['versions'][-1]})")
    bank["weights"][version] = detached_copy(model)
    bank["versions"].append(version)
    while len(bank["versions"]) > bank["max_snapshots"]:
        del bank["weights"][bank["versions"].pop(0)]
    return True


def snapshot_weights(bank: dict, version: int) -> dict:
    """The state dict stored as ``version``; asking for a version the bank dropped or has not stored
    yet is a ValueError that names the versions it holds."""
    if version not in bank["weights"]:
        held = bank["versions"]
        why = ("it has not been stored yet" if not held or version > held[-1] else
               "it was dropped (the bank keeps the newest max_snapshots)" if version % bank["every"] == 0 and
               version < held[0] else f"snapshots are taken every {bank['every']} versions")
        raise ValueError(f"the checkpoint bank holds versions {held}, not {version}: {why}")
    return bank["weights"][version]


def bank_policy(bank: dict, version: int, template: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``template`` (same architecture) carrying the weights of ``version``, in eval mode."""
    model = copy.deepcopy(template)
    model.load_state_dict(snapshot_weights(bank, version))
    return model.eval()


def choose_version(bank: dict, which: str, generator: torch.Generator | None = None) -> int:
    """The held version that writes this step's prefixes: the ``"oldest"`` (the largest lag), the
    ``"latest"``, or one drawn uniformly (``"random"``, with ``generator``)."""
    if which not in CHOICES:
        raise ValueError(f"which must be one of {CHOICES}, got {which!r}")
    held = bank["versions"]
    if not held:
        raise ValueError("the checkpoint bank is empty: take a snapshot before asking it for a writer")
    if which == "oldest":
        return held[0]
    if which == "latest":
        return held[-1]
    return held[int(torch.randint(len(held), (1,), generator=generator))]


def cut_points(lengths: torch.Tensor, prefix_frac: Sequence[float], generator: torch.Generator | None) -> torch.Tensor:
    """How many of the writer's tokens each seeded row keeps: ``k = round(u L)`` clamped to
    ``[1, L]``, with ``u ~ U[lo, hi]`` and ``L`` the writer's response length (EOS included).

    =========== ======== =====================================================
    lengths     ``(S,)`` the writer's response lengths (>= 1)
    prefix_frac 2        ``(lo, hi)`` with ``0 < lo <= hi <= 1``
    returns              ``(S,)`` long cut points; ``k == L`` means the writer wrote the whole row
    =========== ======== =====================================================
    """
    lo, hi = (float(x) for x in prefix_frac)
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(f"prefix_frac must be (lo, hi) with 0 < lo <= hi <= 1, got {tuple(prefix_frac)}")
    if (lengths < 1).any():
        raise ValueError("every writer response must have at least one token")
    u = lo + (hi - lo) * torch.rand(len(lengths), generator=generator, dtype=torch.float64)
    return torch.minimum(torch.clamp(torch.round(u * lengths.double()).long(), min=1), lengths.long())


def _encode_ok(tokenizer, contexts: list[str], prompt_ids: list[list[int]], prefix_ids: list[list[int]]) -> None:
    """The sampler re-encodes ``prompt + prefix text``; it must give the prompt's ids then the prefix's."""
    got = tokenizer(contexts, add_special_tokens=False)["input_ids"]
    for c, g, p, q in zip(contexts, got, prompt_ids, prefix_ids):
        if g != p + q:
            raise ValueError(f"the tokenizer does not encode the context {c!r} as the prompt's ids followed by the "
                             "prefix's; prefix continuation needs a tokenizer that re-encodes decoded text exactly, "
                             "such as rlcourse.lm.build_tokenizer()")


def _continue_prefixes(model, tokenizer, seeded: RolloutBatch, cuts: torch.Tensor, config, generator) -> RolloutBatch:
    """The seeded rows after the current policy continues each writer prefix: the first ``cuts[i]``
    tokens and their log-probs are the writer's, the rest the current policy's sample. A row whose
    prefix already holds EOS (``cuts[i]`` equal to its length) is left as the writer wrote it."""
    T = seeded.response_len
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ids, logp = seeded.response_ids.clone(), seeded.logprobs.clone()
    cols = torch.arange(T)[None, :]
    from_bank = (cols < cuts[:, None]).float()
    ids = torch.where(from_bank.bool(), ids, torch.full_like(ids, pad))
    logp = logp * from_bank
    todo = (cuts < seeded.lengths).nonzero().squeeze(-1).tolist()
    if todo:
        prefix = [ids[r, :int(cuts[r])].tolist() for r in todo]
        contexts = [seeded.prompts[r] + tokenizer.decode(q, skip_special_tokens=False) for r, q in zip(todo, prefix)]
        _encode_ok(tokenizer, contexts, [tokenizer(seeded.prompts[r], add_special_tokens=False)["input_ids"]
                                         for r in todo], prefix)
        budget = T - int(cuts[todo].min())
        cont = sample(model, tokenizer, contexts, num_generations=1, max_new_tokens=budget,
                      temperature=config.temperature, top_k=config.top_k, top_p=config.top_p, generator=generator)
        for j, r in enumerate(todo):
            k = int(cuts[r])
            n = min(T - k, int(cont.lengths[j]))  # the continuation cropped to the row's budget
            ids[r, k:k + n] = cont.response_ids[j, :n]
            logp[r, k:k + n] = cont.logprobs[j, :n]
    is_eos = (ids == eos).long()
    mask = ((is_eos.cumsum(1) - is_eos) == 0).float()
    texts = tokenizer.batch_decode(ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
    return replace(seeded, response_ids=ids, response_mask=mask, logprobs=logp * mask, truncated=is_eos.sum(1) == 0,
                   texts=texts, entropy=torch.zeros_like(logp), extras={"from_bank": from_bank * mask})


def bank_mixed_batch(model, tokenizer, prompts: Sequence[str], config, generator: torch.Generator | None, state: dict,
                     step: int, *, every: int = 5, max_snapshots: int = 2, which: str = "oldest",
                     seeded: int | None = None, prefix_frac: Sequence[float] = (0.25, 0.5)) -> RolloutBatch:
    """One rollout batch in which ``seeded`` of each prompt's ``G`` rows start from a bank policy.

    At step ``k`` the bank first stores the current weights if version ``k - 1`` is due
    (:func:`take_snapshot`), then one held version (:func:`choose_version`) samples ``seeded``
    responses per prompt; each keeps its first ``cut_points`` tokens, and the current policy continues
    it within the same ``max_completion_length``. ``prefix_frac = (1, 1)`` keeps the writer's whole
    response: sequence-level mixing. The other ``G - seeded`` rows are sampled by the current policy.
    Rows of a group are contiguous: on-policy rows first, seeded rows last.

    ====================== ========= ================================================================
    logprobs               ``(B,T)`` the behaviour log-prob of each token: the writer's (recorded when it
                                     sampled) on ``from_bank`` tokens, the current policy's elsewhere
    entropy                ``(B,T)`` the *current* policy's entropy at every token (also on prefixes)
    extras["from_bank"]    ``(B,T)`` 1 on tokens the bank policy wrote
    extras["bank_version"] ``(B,T)`` the writer's version on those tokens, 0 elsewhere
    ====================== ========= ================================================================

    ``batch.metrics`` (logged by the trainer with the step's metrics):

    ======================== ==============================================================
    bank_writer_version      the version that wrote this step's bank rows
    bank_lag                 the current version minus the writer's
    bank_token_share         share of the batch's response tokens the bank wrote
    bank_finished_by_writer  share of seeded rows the writer finished itself (EOS in the prefix)
    bank_prefix_log_ratio    mean ``log pi_current - log pi_writer`` over the writer's tokens,
                             at sampling time (0 when the bank wrote no token)
    ======================== ==============================================================
    """
    G = config.num_generations
    n_seeded = G // 2 if seeded is None else seeded
    if not isinstance(n_seeded, int) or not 0 <= n_seeded <= G:
        raise ValueError(f"seeded must be an integer in [0, G={G}], got {seeded!r}")
    if step < 1:
        raise ValueError(f"step must be >= 1 (the trainer's steps are 1-based), got {step}")
    bank = bank_of(state, every, max_snapshots)
    current = step - 1
    take_snapshot(bank, model, current)
    version = choose_version(bank, which, generator)
    T = config.max_completion_length
    kw = dict(max_new_tokens=T, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
              generator=generator)
    parts = []
    if G - n_seeded:
        on = sample(model, tokenizer, prompts, num_generations=G - n_seeded, **kw)
        parts.append(replace(on, extras={"from_bank": torch.zeros_like(on.logprobs)}))
    if n_seeded:
        writer = bank_policy(bank, version, model)
        written = sample(writer, tokenizer, prompts, num_generations=n_seeded, **kw)
        cuts = cut_points(written.lengths, prefix_frac, generator)
        parts.append(_continue_prefixes(model, tokenizer, written, cuts, config, generator))
        finished_by_writer = float((cuts == written.lengths).float().mean())
    else:
        finished_by_writer = 0.0
    for p in parts:
        p.entropy = torch.zeros_like(p.logprobs)
    both = cat_batches(parts, tokenizer.pad_token_id)
    N = len(prompts)
    # put each prompt's rows together: its on-policy rows, then its seeded rows
    per = [G - n_seeded, n_seeded]
    order, start = [], [0, N * per[0]]
    for i in range(N):
        for part in range(2):
            order += [start[part] + i * per[part] + j for j in range(per[part])]
    batch = both.select(order)
    batch.index = torch.arange(N, device=batch.index.device).repeat_interleave(G)
    from_bank = batch.extras["from_bank"]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            cur, ent = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len,
                                         batch.temperature, return_entropy=True)
    finally:
        model.train(was_training)
    mask = batch.response_mask
    writer_lp = batch.logprobs
    batch.logprobs = torch.where(from_bank.bool(), writer_lp, cur) * mask
    batch.entropy = ent.float() * mask
    batch.extras = {"from_bank": from_bank, "bank_version": from_bank * float(version)}
    n_bank = float(from_bank.sum())
    batch.metrics = {"bank_writer_version": float(version), "bank_lag": float(current - version),
                     "bank_token_share": n_bank / max(1.0, float(mask.sum())),
                     "bank_finished_by_writer": finished_by_writer,
                     "bank_prefix_log_ratio": float(((cur - writer_lp) * from_bank).sum()) / n_bank if n_bank else 0.0}
    return batch
