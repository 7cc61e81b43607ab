"""A tokenizer that covers a model's whole vocabulary: every id decodes to text that encodes back to it.

For random-weight checkpoints of published shapes (`--shape llama-3-8b`: 128,256 ids). A trained BPE
of that size needs far more text than kvpilot ships, and a small tokenizer leaves most generated ids
without text (a stream then carries no chunk for them). This one is built, not trained:

- ids 0-3: `<bos>`, `<eos>`, `<pad>`, `<unk>` (special);
- one token per printable ASCII character, tab and newline;
- two-character merges (a non-vowel ASCII character + a vowel), then three-character ones (such a pair
  + any printable ASCII character). The first characters of the pairs are never vowels, so a pair's
  second character never starts another pair: BPE on a token's own text rebuilds exactly that token;
- single Unicode characters for the rest (Latin-1 onwards, CJK, emoji, ...), leaving out what could
  break a line-based stream or be taken for a cut multi-byte character (C1 controls, U+2028/U+2029,
  U+FFFD, noncharacters, surrogates). Text outside the vocabulary encodes to `<unk>`.

No normaliser and no pre-tokeniser (a text is one BPE word), and a decoder that concatenates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SPECIALS = ("<bos>", "<eos>", "<pad>", "<unk>")
_ASCII = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n"]
_VOWELS = "aeiouAEIOU"
# letters first, so the three-character merges that fit are the word-like ones
_BY_USE = " abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "0123456789" + "".join(
    c for c in map(chr, range(0x21, 0x7F)) if not c.isalnum()
)
_FIRSTS = [c for c in _BY_USE if c not in _VOWELS]
_THIRDS = list(_BY_USE)
MAX_TRIPLES = 30_000  # three-character merges at most; ids beyond them are single characters
_RANGES = ((0x00A0, 0xD7FF), (0xE000, 0xFFFC), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x2A700, 0x2EBEF),
           (0x30000, 0x3134F))  # fmt: skip
_LEFT_OUT = {0x2028, 0x2029, 0xFFFD, *range(0xFDD0, 0xFDF0)}


def _characters() -> Iterator[str]:
    for low, high in _RANGES:
        for code in range(low, high + 1):
            if code not in _LEFT_OUT:
                yield chr(code)


def full_vocab_tokens(vocab_size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """(tokens by id, BPE merges by rank) for exactly vocab_size ids."""
    pairs = [(a, b) for a in _FIRSTS for b in _VOWELS]
    fixed = len(SPECIALS) + len(_ASCII) + len(pairs)
    if vocab_size < fixed:
        raise ValueError(f"a full-vocabulary tokenizer needs vocab_size >= {fixed}, got {vocab_size}")
    triples = [(a + b, c) for c in _THIRDS for a, b in pairs]  # each pair with its likeliest thirds first
    chars = list(_characters())
    num_triples = min(MAX_TRIPLES, vocab_size - fixed)
    num_chars = vocab_size - fixed - num_triples
    if num_chars > len(chars):  # a very large vocabulary: more merges, all characters
        num_chars = len(chars)
        num_triples = vocab_size - fixed - num_chars
        if num_triples > len(triples):
            raise ValueError(f"vocab_size {vocab_size} is larger than this tokenizer can fill "
                             f"({fixed + len(triples) + len(chars)} ids at most)")  # fmt: skip
    merges = pairs + triples[:num_triples]
    tokens = [*SPECIALS, *_ASCII, *(a + b for a, b in merges), *chars[:num_chars]]
    assert len(tokens) == vocab_size and len(set(tokens)) == vocab_size
    return tokens, merges


def build_full_vocab_tokenizer(vocab_size: int) -> Any:
    """A `tokenizers.Tokenizer` over exactly vocab_size ids (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models

    tokens, merges = full_vocab_tokens(vocab_size)
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    return tok
