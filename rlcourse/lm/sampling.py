"""Batched sampling with the KV cache: ``G`` samples per prompt, one rollout batch.

The batch follows the conventions of TRL and verl: prompts left-padded, responses right-padded,
``response_mask`` equal to 1 up to and including EOS, the ``G`` samples of a prompt contiguous, and
``index`` holding each row's prompt (group) id.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from .engine import KVCache, LeanWeights, lean_engine_refusal, lean_engine_supports, lean_forward
from .model import position_ids_from_mask


@dataclass
class RolloutBatch:
    """One batch of sampled responses; ``B = len(prompts) * G``.

    ================ ========= ================================================================
    prompt_ids       ``(B,P)`` left-padded prompt ids (row ``i`` is prompt ``i // G``)
    prompt_mask      ``(B,P)`` 1 on real prompt tokens
    response_ids     ``(B,T)`` right-padded response ids (pad after EOS)
    response_mask    ``(B,T)`` float, 1 up to and including EOS
    logprobs         ``(B,T)`` float32 log pi(y_t) at the sampling temperature; 0 where masked
    index            ``(B,)``  long, the prompt (group) id of each row
    truncated        ``(B,)``  bool, True where no EOS came within ``max_new_tokens``
    prompts, texts   ``B``     prompt strings and decoded responses (special tokens removed)
    temperature      float     the temperature the log-probs were taken at
    entropy          ``(B,T)`` entropy of the tempered next-token distribution; 0 where masked
                               (None if the sampler did not record it)
    extras           dict      further per-token ``(B,T)`` tensors a sampler recorded for a part
                               of the loop (e.g. OTB's ``sum_pi_sq``); :meth:`select` and
                               :meth:`widen` carry them, so they survive any later step
    scores           ``(B,)``  the rewards, when the sampler already scored the rows with the
                               loop's reward (the trainer then uses them); None otherwise
    attention        ``(B,T)`` 1 on every real token of the response side, in the loss or not
                               (a multi-turn episode's environment replies are read by the model
                               but masked out of the loss); None means ``response_mask``
    examples         ``B``     the task example of each row, when the sampler adds rows that are
                               not among the step's prompts (a replayed group, a cached batch); the
                               trainer then scores and logs with these; None: ``examples[index]``
    metrics          dict      scalars the sampler measured this step (e.g. a replay buffer's
                               share of stale draws); the trainer adds them to the step's metrics
    ================ ========= ================================================================

    The response side must be right-padded: ``attention`` (or ``response_mask``) is 1 on a prefix of
    each row and 0 after it.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    index: torch.Tensor
    truncated: torch.Tensor
    prompts: list[str]
    texts: list[str]
    temperature: float
    entropy: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    examples: list | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        shape = tuple(self.response_ids.shape)
        for name, x in [("response_mask", self.response_mask), ("logprobs", self.logprobs),
                        ("entropy", self.entropy), ("attention", self.attention), *((f"extras[{k!r}]", v) for k, v in self.extras.items())]:
            if x is not None and tuple(x.shape) != shape:
                raise ValueError(f"RolloutBatch: {name} has shape {tuple(x.shape)}, response_ids {shape}")
        if self.scores is not None and tuple(self.scores.shape) != shape[:1]:
            raise ValueError(f"RolloutBatch: scores has shape {tuple(self.scores.shape)}, expected ({shape[0]},)")
        if self.examples is not None and len(self.examples) != shape[0]:
            raise ValueError(f"RolloutBatch: {len(self.examples)} examples for {shape[0]} rows")
        if self.attention is not None and bool(((self.response_mask != 0) & (self.attention == 0)).any()):
            raise ValueError("RolloutBatch: a token is in the loss (response_mask 1) but not attended (attention 0)")

    @property
    def input_ids(self) -> torch.Tensor:
        """``(B, P+T)``: prompt then response, ready for :func:`response_logprobs`."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def response_attention(self) -> torch.Tensor:
        """``(B,T)``: 1 on every real response-side token (``attention``, else ``response_mask``)."""
        return self.response_mask if self.attention is None else self.attention

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_attention.long()], dim=1)

    @property
    def response_len(self) -> int:
        return self.response_ids.shape[1]

    @property
    def lengths(self) -> torch.Tensor:
        """``(B,)`` number of response tokens including EOS."""
        return self.response_mask.sum(-1).long()

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows: torch.Tensor | Sequence[int]) -> "RolloutBatch":
        """The sub-batch of the given rows (tensors and lists alike)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        pick = [int(r) for r in rows]
        tensors = {k: getattr(self, k)[rows] for k in
                   ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "index", "truncated")}
        if self.entropy is not None:
            tensors["entropy"] = self.entropy[rows]
        if self.scores is not None:
            tensors["scores"] = self.scores[rows]
        if self.attention is not None:
            tensors["attention"] = self.attention[rows]
        return replace(self, **tensors, extras={k: v[rows] for k, v in self.extras.items()},
                       prompts=[self.prompts[i] for i in pick], texts=[self.texts[i] for i in pick],
                       examples=None if self.examples is None else [self.examples[i] for i in pick])

    def widen(self, T: int, pad_token_id: int) -> "RolloutBatch":
        """A copy whose per-token tensors are right-padded to ``T`` columns (``response_ids`` with
        ``pad_token_id``; the masks, log-probs, entropy and every extra with 0). ``T`` below the
        current width is an error; equal returns a copy."""
        extra = int(T) - self.response_len
        if extra < 0:
            raise ValueError(f"widen: T={T} is narrower than the batch's {self.response_len} columns")
        pad = lambda x, v=0.0: None if x is None else torch.nn.functional.pad(x, (0, extra), value=v)  # noqa: E731
        return replace(self, response_ids=pad(self.response_ids, pad_token_id), response_mask=pad(self.response_mask),
                       logprobs=pad(self.logprobs), entropy=pad(self.entropy), attention=pad(self.attention),
                       extras={k: pad(v) for k, v in self.extras.items()})


def cat_batches(batches: Sequence[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """One batch holding the rows of ``batches`` in order: prompts left-padded and responses
    right-padded to the widest, group ids offset so that groups of different batches stay apart.

    ======== ========================================================================
    batches  a non-empty sequence of :class:`RolloutBatch` sampled at one temperature, all
             with or all without ``entropy``, ``scores``, ``attention`` and ``examples``, with
             the same ``extras`` keys (``metrics`` are not carried: they describe a step)
    returns  ``(sum of B, max P)`` prompts and ``(sum of B, max T)`` responses
    ======== ========================================================================

    Extra left padding changes no log-prob (positions come from the attention mask), and extra
    right padding is masked out, so every row means what it meant in its own batch.
    """
    batches = list(batches)
    if not batches:
        raise ValueError("cat_batches needs at least one batch")
    first = batches[0]
    for name, same in [("temperature", lambda b: b.temperature == first.temperature),
                       ("entropy (recorded or not)", lambda b: (b.entropy is None) == (first.entropy is None)),
                       ("scores (given or not)", lambda b: (b.scores is None) == (first.scores is None)),
                       ("attention (given or not)", lambda b: (b.attention is None) == (first.attention is None)),
                       ("examples (given or not)", lambda b: (b.examples is None) == (first.examples is None)),
                       ("extras keys", lambda b: set(b.extras) == set(first.extras))]:
        if not all(same(b) for b in batches):
            raise ValueError(f"cat_batches: the batches differ in {name}")
    P = max(b.prompt_ids.shape[1] for b in batches)
    T = max(b.response_len for b in batches)
    wide = [b.widen(T, pad_token_id) for b in batches]
    left = lambda x, v: torch.nn.functional.pad(x, (P - x.shape[1], 0), value=v)  # noqa: E731
    offsets, index = 0, []
    for b in wide:
        index.append(b.index + offsets)
        offsets += int(b.index.max()) + 1 if len(b) else 0
    cat = lambda name: torch.cat([getattr(b, name) for b in wide])  # noqa: E731
    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, pad_token_id) for b in wide]),
        prompt_mask=torch.cat([left(b.prompt_mask, 0) for b in wide]),
        response_ids=cat("response_ids"), response_mask=cat("response_mask"), logprobs=cat("logprobs"),
        index=torch.cat(index), truncated=cat("truncated"),
        prompts=[p for b in wide for p in b.prompts], texts=[t for b in wide for t in b.texts],
        temperature=first.temperature, entropy=None if first.entropy is None else cat("entropy"),
        extras={k: torch.cat([b.extras[k] for b in wide]) for k in first.extras},
        scores=None if first.scores is None else cat("scores"),
        attention=None if first.attention is None else cat("attention"),
        examples=None if first.examples is None else [e for b in wide for e in b.examples])


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to ``-inf`` the logits outside the top-k tokens and outside the top-p nucleus.

    ======= ========= =============================================
    logits  ``(B,V)`` next-token scores (already divided by T)
    returns ``(B,V)`` the same, with excluded tokens at ``-inf``
    ======= ========= =============================================
    """
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass of the tokens ranked above it already reaches top_p
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, mask)`` of shape ``(N, P)``; raises on an empty list or an empty prompt."""
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, not one string")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: nothing to sample")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p:
            raise ValueError(f"prompt {i} is empty or not a string: {p!r}")
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def _decoder(model, ids: torch.Tensor, mask: torch.Tensor, G: int, max_new_tokens: int, engine: str):
    """Prefill the ``N`` distinct prompts; return the next-token logits of all ``B = N * G`` rows and
    ``advance(tok, done, n_done) -> (B,V)``, which feeds one sampled token per row and returns the
    logits that follow (rows already ``done``, ``n_done`` of them, get logits that the caller ignores).

    Both engines run each prompt once and copy its keys and values to its ``G`` samples (prefix
    sharing: ``transformers``' cache by ``batch_repeat_interleave``); the lean engine also drops
    finished rows from the decode batch once a quarter of them are done.
    """
    if engine == "hf" or not lean_engine_supports(model):
        positions = position_ids_from_mask(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out.cache
        if G > 1:
            cache.batch_repeat_interleave(G)
        hf = {"cache": cache, "pos": positions.repeat_interleave(G, 0)[:, -1:], "attn": mask.repeat_interleave(G, 0)}

        def advance_hf(tok, done, n_done):
            hf["pos"] = hf["pos"] + 1
            hf["attn"] = torch.cat([hf["attn"], torch.ones_like(hf["attn"][:, :1])], dim=1)
            step = model(input_ids=tok[:, None], attention_mask=hf["attn"], position_ids=hf["pos"],
                         cache=hf["cache"], use_cache=True)
            hf["cache"] = step.cache
            return step.logits[:, -1]
        return out.logits[:, -1].repeat_interleave(G, 0), advance_hf

    N = ids.shape[0]
    weights = LeanWeights.from_model(model)
    cache = KVCache.empty(model, N, ids.shape[1] + max_new_tokens)
    positions = position_ids_from_mask(mask)
    first = lean_forward(model, weights, ids, positions, mask.bool(), cache)
    per_row = torch.arange(N, device=ids.device).repeat_interleave(G)
    cache.select_rows(per_row)
    lean = {"live": torch.arange(N * G, device=ids.device), "pos": positions[per_row, -1:],
            "ok": torch.ones(N * G, 1, dtype=torch.bool, device=ids.device)}

    def advance_lean(tok, done, n_done):
        live = lean["live"]
        # the rows outside `live` are all done, so B - n_done of the live rows still run (no sync needed)
        if len(done) - n_done <= 0.75 * len(live):  # compact: decode only the rows still running
            keep = (~done[live]).nonzero().squeeze(-1)
            cache.select_rows(keep)
            live, lean["pos"], lean["ok"] = live[keep], lean["pos"][keep], lean["ok"][:len(keep)]
            lean["live"] = live
        lean["pos"] = lean["pos"] + 1
        if len(live) == len(done):  # no row dropped yet
            return lean_forward(model, weights, tok[:, None], lean["pos"], lean["ok"], cache)
        logits = lean_forward(model, weights, tok[live, None], lean["pos"], lean["ok"], cache)
        return logits.new_zeros(len(done), logits.shape[-1]).index_copy_(0, live, logits)
    return first.repeat_interleave(G, 0), advance_lean


def device_generator(generator: torch.Generator | None, device: torch.device | str) -> torch.Generator | None:
    """The generator to draw tokens with on ``device``: ``generator`` itself when it lives there
    (on the CPU, draws are unchanged), else a new generator on ``device`` seeded from one draw of
    ``generator``. The probabilities then never leave the device, and since the seed comes from the
    CPU generator, whose state a checkpoint keeps, a resumed run draws the same tokens."""
    if generator is None:
        return None
    device = torch.device(device)
    if generator.device.type == device.type:
        return generator
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from ``probs`` ``(B,V)`` by inverting the CDF at a uniform draw (the same
    distribution as ``torch.multinomial``, an order of magnitude cheaper for one draw per row)."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u < total, even after rounding
    # the first token whose cumulative mass exceeds u: never one of probability zero
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    num_generations: int = 1,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    engine: str = "auto",
    proposal: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> RolloutBatch:
    """Sample ``num_generations`` responses for each prompt, all rows in one batch, with the KV cache.

    ``temperature=0`` decodes greedily (its log-probs are then taken at temperature 1). The
    log-probs are those of ``softmax(logits / temperature)`` before top-k / top-p filtering, which
    is what :func:`~rlcourse.lm.response_logprobs` recomputes at training time; with filtering on,
    the samples are therefore slightly off-policy with respect to those log-probs.

    ``engine`` picks the forward pass: ``"hf"`` calls the ``transformers`` model with its KV cache;
    ``"lean"`` runs the same weights through :func:`rlcourse.lm.engine.lean_forward` (faster on
    the tiny model, same logits up to float rounding); ``"auto"`` takes ``"lean"`` when the
    model supports it.

    ``proposal`` draws the tokens from another distribution than the policy's (an exploratory
    decoding rule): it maps the tempered logits ``(B,V)`` of each step to sampling probabilities
    ``(B,V)`` (non-negative, positive total per row; rows need not be normalised), in place of
    top-k / top-p filtering. ``logprobs`` stay the policy's, and the behaviour log-probabilities
    ``log q(y_t)`` of the drawn tokens go to ``extras["behaviour_logprob"]`` ``(B,T)`` (0 where
    masked), so a loss can weight by ``pi / q``.
    """
    if num_generations < 1:
        raise ValueError(f"num_generations (G) must be at least 1, got {num_generations}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if proposal is not None and temperature == 0:
        raise ValueError("a proposal distribution needs temperature > 0 (temperature=0 decodes greedily)")
    if proposal is not None and (top_k or top_p != 1.0):
        raise ValueError("give either a proposal or top_k/top_p filtering, not both")
    if engine not in ("auto", "hf", "lean"):
        raise ValueError(f"engine must be 'auto', 'hf' or 'lean', got {engine!r}")
    if engine == "lean" and (why := lean_engine_refusal(model)) is not None:
        raise ValueError(f"engine='lean' cannot run this model: {why}; use engine='hf' or 'auto'")
    ids, mask = encode_prompts(tokenizer, prompts)
    context = getattr(model.config, "max_position_embeddings", None)
    longest = int(mask.sum(-1).max())
    if context is not None and longest + max_new_tokens > context:
        raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
                         f"context of {context} positions")
    device = next(model.parameters()).device
    G = num_generations
    ids, mask = ids.to(device), mask.to(device)
    B = ids.shape[0] * G
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    greedy = temperature == 0
    temp = 1.0 if greedy else float(temperature)

    draws = device_generator(generator, device)  # tokens are drawn where the logits are
    was_training = model.training
    if was_training:  # (toggling walks every submodule: skip it when the model is already in eval mode)
        model.eval()
    logits, advance = _decoder(model, ids, mask, G, max_new_tokens, engine)
    tokens, logps, entropies, behaviour = [], [], [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    # Per step only what depends on the step: masking the tokens, log-probs and entropies after each
    # row's EOS is done once after the loop, and one sync (the count of finished rows) serves both the
    # stop test and the decoder's compaction.
    for step in range(max_new_tokens):
        logits = logits.float() if temp == 1.0 else logits.float() / temp  # x / 1 is x: skip the op
        logp_all = torch.log_softmax(logits, dim=-1)
        p_all = logp_all.exp()
        if greedy:
            tok = logits.argmax(-1)
        elif proposal is not None:
            q = proposal(logits)
            if q.shape != logits.shape or not bool((q >= 0).all()) or not bool((q.sum(-1) > 0).all()):
                raise ValueError(f"proposal must return non-negative probabilities of shape {tuple(logits.shape)} "
                                 f"with a positive total per row, got shape {tuple(q.shape)}")
            q = q / q.sum(-1, keepdim=True)
            tok = _draw(q, draws)
            q_tok = q.gather(-1, torch.where(done, torch.zeros_like(tok), tok)[:, None]).squeeze(-1)
            behaviour.append(torch.where(done, torch.zeros_like(q_tok), q_tok.clamp_min(1e-30).log()))
        else:
            probs = p_all if top_k == 0 and top_p == 1.0 else torch.softmax(filter_logits(logits, top_k, top_p), dim=-1)
            tok = _draw(probs, draws)
        tokens.append(tok)
        logps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        entropies.append((p_all * logp_all).sum(-1))  # minus the entropy
        done = done | (tok == eos)
        n_done = int(done.sum())
        if n_done == B or step == max_new_tokens - 1:
            break
        logits = advance(tok, done, n_done)
    if was_training:
        model.train()

    drawn = torch.stack(tokens, 1)  # after a row's EOS: whatever was drawn for it
    is_eos = (drawn == eos).long()
    # up to and including the first EOS: count of EOS strictly before position t is zero
    before = is_eos.cumsum(1) - is_eos
    in_response = before == 0
    response_mask = in_response.float()
    response_ids = drawn.masked_fill(~in_response, pad)
    truncated = is_eos.sum(1) == 0
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    extras = {"behaviour_logprob": torch.stack(behaviour, 1) * response_mask} if proposal is not None else {}
    return RolloutBatch(
        prompt_ids=ids.repeat_interleave(G, 0), prompt_mask=mask.repeat_interleave(G, 0), response_ids=response_ids, response_mask=response_mask,
        logprobs=torch.where(in_response, torch.stack(logps, 1), 0.0),
        index=torch.arange(len(prompts), device=device).repeat_interleave(G),
        truncated=truncated, prompts=[p for p in prompts for _ in range(G)], texts=texts,
        temperature=temp, entropy=torch.where(in_response, -torch.stack(entropies, 1), 0.0), extras=extras,
    )
