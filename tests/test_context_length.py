"""A model's context, as vLLM derives max_model_len from its config (vllm/config/model.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specsure.models.decoder_family import context_length


def _config(rope: object, max_positions: int = 4096) -> SimpleNamespace:
    return SimpleNamespace(max_position_embeddings=max_positions, rope_parameters=rope)


@pytest.mark.parametrize(("rope", "expected"), [
    (None, 4096),
    ({"rope_type": "default", "rope_theta": 10000.0}, 4096),
    ({"rope_type": "linear", "factor": 4.0}, 16384),
    ({"rope_type": "dynamic", "factor": 2.0}, 8192),
    ({"type": "dynamic", "factor": 2.0}, 8192),  # the key older configs spell it with
    # these count the stretched context in max_position_embeddings already (vLLM 0.33.0)
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 4096),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 4096),
    ({"rope_type": "longrope", "factor": 32.0, "original_max_position_embeddings": 4096}, 4096),
    ({"rope_type": "deepseek_yarn", "factor": 40.0}, 4096),
    # per layer type: the last factor found counts, as in vLLM
    ({"full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}}, 8192),
    ({"rope_type": "linear"}, 4096),
    ({"rope_type": "linear", "factor": None}, 4096),  # vLLM falls back to 1.0 for a null factor
    ({"rope_type": "linear", "factor": True}, 4096),
    ({"rope_type": "linear", "factor": "4"}, 4096),
])
def test_the_context_is_vllms(rope: object, expected: int) -> None:
    assert context_length(_config(rope)) == expected


def test_gemma3_counts_its_scaled_context_already() -> None:
    config = _config({"full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {}}, 131072)
    config.model_type = "gemma3_text"
    assert context_length(config) == 131072


def test_a_linear_rope_runs_past_max_position_embeddings(tmp_path) -> None:  # noqa: ANN001
    """A linear RoPE of factor 4 on a 48-position model runs 192 positions: a prompt of 60 tokens is not
    refused, and speculation past position 48 equals plain decoding."""
    from specsure import SamplingParams, make_engine
    from tiny import build_tiny_llama

    folder = build_tiny_llama(tmp_path / "linear", vocab_size=96, hidden_size=64, num_layers=2,
                              extra_config={"max_position_embeddings": 48,
                                            "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    plain = make_engine(str(folder), None, dtype="float32")
    assert plain.target.lm.max_context == 192
    prompt = [(5 * i) % 90 + 3 for i in range(60)]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    expected = plain.generate(prompt, params)[0].token_ids
    assert len(expected) == 30
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    engine = make_engine(str(folder), spec, dtype="float32")
    assert engine.generate(prompt, params)[0].token_ids == expected
