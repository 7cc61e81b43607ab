"""The named shapes' tokenizer covers the whole vocabulary: each id is text that encodes back to it."""

from __future__ import annotations

import random

import pytest

from kvpilot.bench.shapes import SHAPES, write_shape
from kvpilot.engine.make_model.full_vocab import SPECIALS, full_vocab_tokens
from kvpilot.engine.server.wire.detokenizer import IncrementalText
from kvpilot.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def llama3_tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_shape("llama-3-8b", tmp_path_factory.mktemp("llama-3-8b")))


def test_every_id_of_the_llama3_shape_decodes_to_text_that_encodes_back(llama3_tokenizer: Tokenizer) -> None:
    tok = llama3_tokenizer
    assert tok.vocab_size == SHAPES["llama-3-8b"]["vocab_size"] == 128_256
    texts = [tok.decode([i], skip_special_tokens=False) for i in range(tok.vocab_size)]
    assert all(texts), [i for i, t in enumerate(texts) if not t][:10]
    encoded = tok.backend.encode_batch(texts, add_special_tokens=False)
    wrong = [(i, texts[i], e.ids) for i, e in enumerate(encoded) if e.ids != [i]]
    assert not wrong, wrong[:10]
    assert tok.eos_token_id == 1 and tok.bos_token_id == 0  # the shapes' config.json ids


def test_generated_ids_stream_as_text_and_text_prompts_round_trip(llama3_tokenizer: Tokenizer) -> None:
    tok = llama3_tokenizer
    rng = random.Random(0)
    ids = [rng.randrange(len(SPECIALS), tok.vocab_size) for _ in range(500)]  # what a random model generates
    detok = IncrementalText(tok)
    deltas = [detok.add([i]) for i in ids]
    assert all(deltas)  # every token reaches the stream as a chunk of its own
    assert "".join(deltas) + detok.finish() == tok.decode(ids)
    text = "Hello, world!\n\tdef main(): return 0  # ü 你好 😀"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("vocab_size", [951, 102_400, 152_064])
def test_other_vocabulary_sizes_fill_exactly(vocab_size: int) -> None:
    tokens, merges = full_vocab_tokens(vocab_size)
    assert len(tokens) == len(set(tokens)) == vocab_size
    assert all(a + b in tokens[len(SPECIALS):] for a, b in merges[:5])


def test_too_small_a_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size >= 951"):
        full_vocab_tokens(512)


def test_make_model_and_serve_take_a_shape(tmp_path) -> None:
    import argparse
    import json

    from kvpilot.cli import main
    from kvpilot.engine.server import cli as serve_cli

    assert main(["make-model", str(tmp_path / "m"), "--shape", "qwen2-7b"]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["vocab_size"] == 152_064
    assert Tokenizer(tmp_path / "m").vocab_size == 152_064
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--shape", "llama-3-8b", "--device", "cpu", "--num-kv-blocks", "8"])
    config, settings, _ = serve_cli._prepare(args)
    assert (config.load_format, settings.model_name) == ("dummy", "llama-3-8b")
    assert Tokenizer(config.model).vocab_size == 128_256
    with pytest.raises(SystemExit):  # one source: a directory or a shape
        parser.parse_args(["--shape", "llama-3-8b", "--model", str(tmp_path / "m")])
