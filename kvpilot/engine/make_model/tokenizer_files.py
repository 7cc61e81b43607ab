"""The tokenizer files of a random checkpoint: a byte-level BPE trained on local text, or the built
full-vocabulary tokenizer of the named shapes (full_vocab.py), plus generation_config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<bos>", "<eos>", "<pad>")
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>\n<tool_call>{{ tools | map(attribute='function') | map(attribute='name')"
    " | join(', ') }}</tool_call>{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
STDLIB_SOURCES = ("textwrap.py", "string.py", "json/decoder.py", "json/encoder.py", "argparse.py", "shlex.py")


def training_text() -> list[str]:
    """Local text to learn BPE merges from: a few of Python's own standard-library sources."""
    stdlib = Path(os.__file__).parent
    texts = [
        (stdlib / name).read_text(encoding="utf-8") for name in STDLIB_SOURCES if (stdlib / name).is_file()
    ]
    return texts or ["def main():\n    return 0\n" * 200]


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE: 3 special tokens, 256 byte tokens, then merges up to vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size must be >= {len(SPECIAL_TOKENS) + 256} for a byte-level tokenizer, got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, max_len: int = 2048, full_vocab: bool = False) -> None:
    """tokenizer.json + tokenizer_config.json: the trained byte-level BPE, or with `full_vocab` the built
    tokenizer whose every id decodes to text (full_vocab.py: the named shapes' 100k+ vocabularies)."""
    if full_vocab:
        from kvpilot.engine.make_model.full_vocab import build_full_vocab_tokenizer

        tok = build_full_vocab_tokenizer(vocab_size)
    else:
        tok = build_tokenizer(vocab_size)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        **({"unk_token": "<unk>"} if full_vocab else {}),
        "add_bos_token": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_generation_config(out_dir: Path) -> None:
    gen = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))
