"""/tokenize, /detokenize, /version, /tokenizer_info (vLLM's utility routes) and --chat-template FILE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvpilot import __version__
from tests.service.conftest import DEFAULT_FLAGS, SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service


def test_tokenize_detokenize_round_trip(server: ServerProcess, tiny_model: Path) -> None:
    from kvpilot.engine.tokenizer import Tokenizer

    tok = Tokenizer(tiny_model)
    text = "Tokenize me, then give me back."
    result = httpx.post(server.base_url + "/tokenize", json={"model": SERVED_MODEL, "prompt": text}).json()
    assert result["tokens"] == tok.encode(text) and result["count"] == len(result["tokens"])
    assert result["max_model_len"] == 256
    bare = httpx.post(server.base_url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == tok.encode(text, add_special_tokens=False)
    back = httpx.post(server.base_url + "/detokenize", json={"model": SERVED_MODEL, "tokens": bare["tokens"]}).json()
    assert back["prompt"] == tok.decode(bare["tokens"])
    # special tokens stay in the text, as vLLM's /detokenize keeps them (lm-eval sends that text back)
    special = [tok.eos_token_id, *bare["tokens"]]
    kept = httpx.post(server.base_url + "/detokenize", json={"tokens": special}).json()["prompt"]
    assert kept == tok.eos_token + text and tok.encode(kept, add_special_tokens=False) == special
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": [1, 10**7]})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]
    neither = httpx.post(server.base_url + "/tokenize", json={"model": SERVED_MODEL})
    assert neither.status_code == 400 and "exactly one of" in neither.json()["error"]["message"]
    wrong = httpx.post(server.base_url + "/tokenize", json={"model": "other", "prompt": "x"})
    assert wrong.status_code == 404


def test_version_and_tokenizer_info(server: ServerProcess, tiny_model: Path) -> None:
    from kvpilot.engine.tokenizer import Tokenizer

    assert httpx.get(server.base_url + "/version").json() == {"version": __version__}
    info = httpx.get(server.base_url + "/tokenizer_info").json()
    tok = Tokenizer(tiny_model)
    assert info["vocab_size"] == tok.vocab_size and info["eos_token_ids"] == list(tok.eos_token_ids)
    assert info["model_max_length"] == 256 and info["chat_template"] == tok.chat_template


def test_chat_template_file_replaces_the_checkpoints(start_server, tmp_path: Path, tiny_model: Path) -> None:
    from kvpilot.engine.tokenizer import Tokenizer

    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}<<assistant>>")
    custom = start_server(*DEFAULT_FLAGS, "--chat-template", str(template), "--no-warmup")
    messages = [{"role": "user", "content": "hi there"}]
    got = httpx.post(custom.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert got == Tokenizer(tiny_model).encode("<<user>> hi there\n<<assistant>>")
    chat = httpx.post(custom.base_url + "/v1/chat/completions",
                      json={"model": SERVED_MODEL, "messages": messages, "max_tokens": 2}, timeout=60)  # fmt: skip
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == len(got)


@pytest.mark.parametrize(("content", "message"), [(None, "no such file"), ("{% for %}", "does not compile")])
def test_bad_chat_template_file_is_refused_at_start(tmp_path: Path, tiny_model: Path, content, message) -> None:
    path = tmp_path / "t.jinja"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "kvpilot.cli", "serve", "--model", str(tiny_model), "--chat-template", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and message in result.stderr and "--chat-template" in result.stderr, result.stderr
