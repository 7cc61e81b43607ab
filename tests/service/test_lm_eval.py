"""lm-evaluation-harness itself against a real `kvpilot serve`: a small local multiple-choice task
through `local-completions` (echo + logprobs, batches of 4 prompts, the server's remote tokenizer),
and every loglikelihood it computed equals the server's /v1/score for the same context and choice;
a perplexity task sent as text (tokenized_requests=False: lm-eval decodes its token windows through
/detokenize, the first starting with the EOS prefix token) scores what /v1/score scores too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import SERVED_MODEL, ServerProcess

pytestmark = pytest.mark.service

QUESTIONS = [
    ("The sky on a clear day is", ["blue", "green", "loud"], 0),
    ("Two plus two equals", ["four", "seven", "a fish"], 0),
    ("Water freezes at zero degrees", ["Celsius", "Kelvin", "north"], 0),
    ("A cat says", ["meow", "moo", "quack", "woof"], 0),
    ("The opposite of hot is", ["cold", "warm", "tall"], 0),
]

TASK = """task: kvpilot_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


TEXTS = ["The paged cache keeps every block.", "Prefix caching shares the blocks of a common prompt.",
         "A canary takes one percent of the traffic first."]  # fmt: skip

PERPLEXITY_TASK = """task: kvpilot_tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
"""


def run_lm_eval(server: ServerProcess, tmp_path: Path, task: str, yaml_text: str, rows: list[dict],
                tokenized: bool) -> list[dict]:  # fmt: skip
    """Run lm-eval's local-completions on a local task; its logged samples."""
    data = tmp_path / f"{task}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / f"{task}.yaml").write_text(yaml_text.format(data=data))
    out = tmp_path / f"out-{task}"
    model_args = (f"model={SERVED_MODEL},base_url={server.base_url}/v1/completions,tokenizer_backend=remote,"
                  f"tokenized_requests={tokenized},num_concurrent=1,max_retries=1")  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
         "--tasks", task, "--include_path", str(tasks), "--batch_size", "4",
         "--output_path", str(out), "--log_samples"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(line) for f in out.rglob(f"samples_{task}*.jsonl") for line in f.open()]


def test_lm_eval_multiple_choice_matches_score(server: ServerProcess, tmp_path: Path) -> None:
    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS]
    samples = run_lm_eval(server, tmp_path, "kvpilot_tiny_mc", TASK, rows, tokenized=True)
    assert len(samples) == len(QUESTIONS)
    compared = 0
    for sample in samples:
        arguments = sample["arguments"]  # {"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...}
        pairs = [(a["arg_0"], a["arg_1"]) for a in arguments.values()] if isinstance(arguments, dict) else arguments
        for (context, continuation), response in zip(pairs, sample["resps"], strict=True):
            loglikelihood = response[0][0]
            body = {"model": SERVED_MODEL, "prompt": context, "continuation": continuation}
            score = httpx.post(server.base_url + "/v1/score", json=body, timeout=60).json()
            assert float(loglikelihood) == pytest.approx(score["sum_logprob"], abs=1e-3), (context, continuation)
            compared += 1
    assert compared == sum(len(c) for _, c, _ in QUESTIONS)


def test_lm_eval_perplexity_sent_as_text_matches_score(server: ServerProcess, tmp_path: Path,
                                                       tiny_model: Path) -> None:  # fmt: skip
    from kvpilot.engine.tokenizer import Tokenizer

    samples = run_lm_eval(server, tmp_path, "kvpilot_tiny_ppl", PERPLEXITY_TASK, [{"text": t} for t in TEXTS],
                          tokenized=False)  # fmt: skip
    assert sorted(s["doc"]["text"] for s in samples) == sorted(TEXTS)
    # lm-eval scores a whole text after one prefix token: the tokenizer's BOS id, or EOS where that is
    # 0 or missing (RemoteTokenizer); the server gets that token back as its text from /detokenize
    tok = Tokenizer(tiny_model)
    prefix = tok.decode([tok.bos_token_id or tok.eos_token_id], skip_special_tokens=False)
    for sample in samples:
        loglikelihood = float(sample["resps"][0][0])
        body = {"model": SERVED_MODEL, "prompt": prefix, "continuation": sample["doc"]["text"]}
        score = httpx.post(server.base_url + "/v1/score", json=body, timeout=60).json()
        assert loglikelihood == pytest.approx(score["sum_logprob"], abs=1e-3), (sample["doc"], score)
