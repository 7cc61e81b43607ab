"""GPU tier: the calibrated conversions (GQA compensation, MLA weighted two-sided, partial-RoPE MLA with
`turn` pairs) built on CUDA equal the same conversions built on the CPU: calibration runs in fp64 on
whatever device holds the model, and every index and factor must stay on one device (session 8 found an
identity matrix made on the host under a CUDA covariance)."""

from __future__ import annotations

import pytest

from tests.helpers.models import build_hf_checkpoint
from tests.parity.helpers import engine_greedy, make_engine

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
TEXT = " ".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(80))
CASES = {
    "gqa": {"attention": "gqa", "kv_head_groups": 2},
    "mla": {"attention": "mla", "latent_rank": 24},
    "mla-partial": {"attention": "mla", "latent_rank": 16, "mla_rope_dims": 4, "mla_rope_pairs": "turn"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_calibrated_conversion_on_cuda_equals_cpu(tmp_path, case: str, monkeypatch) -> None:
    monkeypatch.delenv("KVPILOT_KERNELS", raising=False)
    calibration = tmp_path / "calibration.txt"
    calibration.write_text(TEXT)
    path = build_hf_checkpoint(tmp_path / "llama", "llama", seed=3, num_key_value_heads=4)
    common = {"dtype": "float32", "conversion_calibration": str(calibration), "calibration_tokens": 256,
              "num_kv_blocks": 64, **CASES[case]}  # fmt: skip
    cpu = make_engine(path, device="cpu", **common)
    gpu = make_engine(path, device="cuda", **common)
    if case == "gqa":
        assert gpu.runner.gqa_orders == cpu.runner.gqa_orders
    else:
        a, b = cpu.stats()["engine"]["mla"], gpu.stats()["engine"]["mla"]
        assert b["reconstruction_error"] == pytest.approx(a["reconstruction_error"], rel=1e-3, abs=1e-5)
    prompt = [(i * 37 + 11) % 370 + 3 for i in range(30)]
    if case == "gqa":  # a least-squares fit: its weights themselves must agree
        weights = gpu.runner.model.state_dict()
        for name, t in cpu.runner.model.state_dict().items():
            if t.is_floating_point():
                assert torch.allclose(t, weights[name].cpu(), rtol=1e-3, atol=1e-4), f"{name} differs on CUDA"
    # SVD factors are unique only up to the sign of each singular pair (LAPACK and cuSOLVER may differ),
    # so the MLA conversions are compared by what they compute: the log-probabilities of a continuation.
    continuation = [(i * 53 + 5) % 370 + 3 for i in range(12)]
    want, got = cpu.score(prompt, continuation), gpu.score(prompt, continuation)
    assert got == pytest.approx(want, rel=1e-3, abs=1e-3)
    assert len(engine_greedy(gpu, [prompt], 8)[0]) == 8
