"""GPU tier: structured output on CUDA (the bitmask copied to the device and applied by xgrammar's
CUDA/Triton kernel, decode under CUDA graphs): 20 random schemas in one batch all validate."""

from __future__ import annotations

import json
import random

import pytest

from kvpilot.engine.llm import LLM
from kvpilot.engine.make_model import make_model
from kvpilot.engine.sampling_params import SamplingParams
from kvpilot.engine.structured.spec import StructuredSpec
from tests.helpers.json_schemas import random_schema

pytestmark = pytest.mark.gpu

jsonschema = pytest.importorskip("jsonschema")


def test_random_schemas_validate_on_cuda(tmp_path) -> None:
    llm = LLM(str(make_model(tmp_path / "tiny", "llama", "tiny")), device="cuda", show_progress=False)
    rng = random.Random(23)
    schemas = [random_schema(rng) for _ in range(20)]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=400, structured=StructuredSpec("json_schema", s))
              for i, s in enumerate(schemas)]  # fmt: skip
    for schema, out in zip(schemas, llm.generate(["Answer in JSON: "] * 20, params), strict=True):
        assert out["finish_reason"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), schema)
    assert len(llm.engine.structured) == 0
