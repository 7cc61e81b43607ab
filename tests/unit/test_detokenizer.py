"""The incremental detokeniser against a full decode: byte-level BPE cases (UTF-8 split over
tokens, invalid bytes, special tokens), stop strings across tokens, and O(1) work per token."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvpilot.engine.make_model import EOS_ID, build_tokenizer
from kvpilot.engine.server.wire.detokenizer import CONTEXT, MAX_WINDOW, DecodeWork, IncrementalText

pytestmark = pytest.mark.unit


class TableDecoder:
    """Token id -> a fixed byte string (several bytes per token, like byte-level BPE merges)."""

    def __init__(self, table: list[bytes]) -> None:
        self.table = table

    def decode(self, token_ids: list[int]) -> str:
        return b"".join(self.table[i] for i in token_ids).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def bpe() -> Any:
    return build_tokenizer(600)


def _stream(decoder: Any, ids: list[int], stop: list[str] | None = None, chunk: int = 1) -> tuple[list[str], IncrementalText]:
    inc = IncrementalText(decoder, stop, work=DecodeWork())
    deltas = [inc.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(inc.finish())
    return deltas, inc


def _byte_ids(bpe: Any, data: bytes) -> list[int]:
    """Ids of byte-level BPE's single-byte tokens spelling `data` (valid UTF-8 or not)."""
    alphabet = _byte_alphabet()
    return [bpe.token_to_id(alphabet[b]) for b in data]


def _byte_alphabet() -> dict[int, str]:
    # GPT-2's byte -> printable character map (what ByteLevel uses for single-byte tokens).
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@pytest.mark.parametrize(
    "text",
    ["plain ascii text with spaces", "héllo wörld — ça va? €100", "日本語のテキストと絵文字 🎉🚀👩‍👩‍👧", "mixed 🎉a€b😀\n\tend"],
)
def test_bpe_stream_equals_full_decode(bpe: Any, text: str) -> None:
    ids = bpe.encode(text).ids
    for chunk in (1, 2, 3):
        deltas, _inc = _stream(bpe, ids, chunk=chunk)
        assert "".join(deltas) == bpe.decode(ids) == text
        assert REPLACEMENT not in "".join(deltas)


REPLACEMENT = "\ufffd"


def test_multibyte_character_split_over_byte_tokens_appears_when_complete(bpe: Any) -> None:
    ids = _byte_ids(bpe, "a🎉b".encode())  # 1 + 4 + 1 single-byte tokens
    deltas, _ = _stream(bpe, ids)
    assert deltas[:6] == ["a", "", "", "", "🎉", "b"]


def test_invalid_bytes_become_replacement_characters_without_waiting(bpe: Any) -> None:
    data = b"x\x80\x80\xffy\xe2\x82z"  # lone continuations, an impossible byte, a truncated character
    ids = _byte_ids(bpe, data)
    deltas, _inc = _stream(bpe, ids)
    assert "".join(deltas) == bpe.decode(ids) == data.decode("utf-8", errors="replace")
    # Each invalid byte is released by the very next token at the latest.
    assert deltas[1] == "" and deltas[2] == REPLACEMENT and deltas[3] == REPLACEMENT


def test_a_stream_of_invalid_bytes_is_never_withheld(bpe: Any) -> None:
    ids = _byte_ids(bpe, b"\x80" * 50)
    inc = IncrementalText(bpe, work=DecodeWork())
    emitted = [inc.add([i]) for i in ids]
    assert all(d == REPLACEMENT for d in emitted[1:])  # one token late at most, never more
    assert "".join(emitted) + inc.finish() == REPLACEMENT * 50


def test_random_byte_streams_equal_full_decode() -> None:
    rng = random.Random(7)
    pool = [bytes([b]) for b in range(256)] + [c.encode() for c in "é€🎉日"] + [b"\xe2\x82", b"\xac ", b"\xf0\x9f"]
    for _ in range(300):
        table = [rng.choice(pool) + (rng.choice(pool) if rng.random() < 0.3 else b"") for _ in range(40)]
        ids = [rng.randrange(len(table)) for _ in range(rng.randrange(1, 60))]
        decoder = TableDecoder(table)
        deltas, _ = _stream(decoder, ids, chunk=rng.choice((1, 1, 2, 5)))
        assert "".join(deltas) == decoder.decode(ids), (table, ids)


def test_special_tokens_are_skipped_mid_stream(bpe: Any) -> None:
    ids = [*bpe.encode("before é").ids, EOS_ID, *bpe.encode(" after 🎉").ids]
    deltas, _ = _stream(bpe, ids)
    assert "".join(deltas) == bpe.decode(ids) == "before é after 🎉"


def test_stop_string_split_over_tokens_and_characters(bpe: Any) -> None:
    text = "value = 3 €€ then STOP€ more"
    ids = _byte_ids(bpe, text.encode())
    deltas, inc = _stream(bpe, ids, stop=["STOP€", "zzz"])
    assert "".join(deltas) == "value = 3 €€ then " and inc.stopped
    deltas, inc = _stream(bpe, ids, stop=["€ t"])
    assert "".join(deltas) == "value = 3 €" and inc.stopped


def test_stop_prefix_that_never_completes_is_released_late_text_matches(bpe: Any) -> None:
    text = "ab🎉 ST then STo then end ST"
    deltas, inc = _stream(bpe, bpe.encode(text).ids, stop=["STOP"])
    assert "".join(deltas) == text and not inc.stopped
    assert deltas[-1].endswith("ST")  # held until the request finished


def test_work_per_token_is_constant_over_a_long_completion(bpe: Any) -> None:
    ids = bpe.encode("é€ def main(): return 🎉 0\n" * 400).ids[:2000]
    work = DecodeWork()
    inc = IncrementalText(bpe, ["never appears"], work=work)
    per_token = []
    for i in ids:
        before = inc.decoded_tokens
        inc.add([i])
        per_token.append(inc.decoded_tokens - before)
    assert len(ids) == 2000
    assert max(per_token) <= MAX_WINDOW + 1 + CONTEXT
    assert sum(per_token[1000:]) <= sum(per_token[:1000]) * 1.05
    assert work.decoded_tokens_total == inc.decoded_tokens and work.output_tokens_total == 2000
    assert inc.text + inc.finish() == bpe.decode(ids)
