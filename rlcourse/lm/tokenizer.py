"""A character-level tokenizer built as a real ``transformers`` fast tokenizer.

Every printable ASCII character is one token, so any task's text (digits, operators, reasoning-gym's
English) round-trips exactly; ``<pad>`` is id 0 and ``<eos>`` id 1. Being a
:class:`transformers.PreTrainedTokenizerFast`, it saves and loads with ``save_pretrained`` /
``from_pretrained`` like any tokenizer on the hub.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHARACTERS = tuple(chr(i) for i in range(32, 127))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The book's tokenizer: 3 special tokens + 95 printable ASCII characters (vocabulary 98).

    Prompts are padded on the left (``padding_side="left"``), as generation needs."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()  # join tokens back without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=10**6,
    )
