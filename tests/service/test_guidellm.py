"""guidellm itself (vLLM's load generator, `guidellm run`) against a real `kvpilot serve`: a short
synthetic benchmark per API it drives (completions, chat, responses), streaming, 4 concurrent
streams, and every request it counts as successful is one the server finished with exactly the
requested number of tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

REQUESTS = 8
PROMPT_TOKENS = 24
OUTPUT_TOKENS = 12


def _counters(server: ServerProcess) -> tuple[int, int]:
    """(finished requests, generated tokens) once nothing is running or waiting."""
    idle = server.wait_stats(lambda s: s["requests"]["running"] == 0 and s["requests"]["waiting"] == 0, 60)
    return idle["requests"]["finished_total"], idle["requests"]["generation_tokens_total"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v1/responses"])
def test_guidellm_synthetic_benchmark_has_no_errors(
    server: ServerProcess, tiny_model: Path, tmp_path: Path, route: str
) -> None:
    finished, generated = _counters(server)
    report = tmp_path / "guidellm.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "guidellm", "run",
         "--backend", f"kind=openai_http,target={server.base_url},model={SERVED_MODEL},request_format={route}",
         "--profile", "kind=concurrent,streams=4",
         "--constraint", f"kind=max_requests,count={REQUESTS}",
         "--tokenizer", f"kind=hf_auto,model={tiny_model}",
         "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
         "--output", f"kind=json,path={report}", "--disable-console"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    # guidellm counts the tokens from the usage the server reports: exactly max_tokens (EOS ignored) ...
    tokens = metrics["output_token_count"]["successful"]
    assert tokens["min"] == tokens["max"] == OUTPUT_TOKENS, tokens
    assert metrics["time_to_first_token_ms"]["successful"]["median"] > 0
    # ... and the server saw the same requests: no retries, no aborted streams, nothing else.
    finished_after, generated_after = _counters(server)
    assert finished_after - finished == REQUESTS
    assert generated_after - generated == REQUESTS * OUTPUT_TOKENS
