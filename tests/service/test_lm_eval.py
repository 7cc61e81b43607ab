"""lm-evaluation-harness itself against a real `kvpilot serve`: a small local multiple-choice task
through `local-completions` (echo + logprobs, batches of 4 prompts, the server's remote tokenizer),
and every loglikelihood it computed equals the server's /v1/score for the same context and choice."""

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


def test_lm_eval_multiple_choice_matches_score(server: ServerProcess, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "kvpilot_tiny_mc.yaml").write_text(TASK.format(data=data))
    out = tmp_path / "out"
    model_args = (f"model={SERVED_MODEL},base_url={server.base_url}/v1/completions,tokenizer_backend=remote,"
                  "tokenized_requests=True,num_concurrent=1,max_retries=1")  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
         "--tasks", "kvpilot_tiny_mc", "--include_path", str(tasks), "--batch_size", "4",
         "--output_path", str(out), "--log_samples"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    samples = [json.loads(line) for f in out.rglob("samples_kvpilot_tiny_mc*.jsonl") for line in f.open()]
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
