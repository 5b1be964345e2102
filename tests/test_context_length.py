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
    # (vLLM before 0.33 took YaRN's original x factor: 2048 here)
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}, 4096),
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


def test_the_smallest_length_key_counts_and_model_max_length_replaces_them() -> None:
    config = _config({"rope_type": "linear", "factor": 2.0})
    config.max_sequence_length = 2048  # vLLM takes the smallest of its length keys
    assert context_length(config) == 4096
    config.model_max_length = 1000  # Command-R's: it replaces them
    assert context_length(config) == 2000
    assert context_length(SimpleNamespace(rope_parameters=None)) == 0  # no key: no limit


def test_per_layer_type_ropes_are_known_by_their_keys() -> None:
    nested = {"full_attention": {"rope_type": "linear", "factor": 4.0}, "sliding_attention": None}
    assert context_length(_config(nested)) == 16384  # a null entry is skipped, as vLLM skips it
    assert context_length(_config({"rope_type": "linear", "factor": 4.0, "extra": {}})) == 16384  # flat


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


@pytest.mark.parametrize(("text", "tokens"), [("8192", 8192), ("8k", 8000), ("25.6k", 25600), ("8K", 8192),
                                              ("2M", 2 * 2**20), ("auto", None), ("-1", None), (" 64 ", 64)])
def test_max_model_len_reads_as_vllm_reads_it(text: str, tokens: int | None) -> None:
    from specsure.cli.common import model_len

    assert model_len(text) == tokens


@pytest.mark.parametrize("text", ["0", "-5", "1.5K", "lots", "", "k", "infk", "1e999k", "1e3k", "1_0k"])
def test_a_bad_max_model_len_is_refused_by_argparse(text: str) -> None:
    import argparse

    from specsure.cli.common import model_len

    with pytest.raises(argparse.ArgumentTypeError):
        model_len(text)


def test_max_model_len_caps_every_request_and_never_exceeds_the_model(tmp_path) -> None:  # noqa: ANN001
    """The engine's context is max_model_len: a longer prompt is refused naming it, generation stops at it,
    and more than the model's own context is refused before any request runs."""
    from specsure import SamplingParams, make_engine
    from specsure.decode.completion import PromptError
    from tiny import build_tiny_llama

    folder = build_tiny_llama(tmp_path / "m", vocab_size=96, hidden_size=64, num_layers=2,
                              extra_config={"max_position_embeddings": 128})
    engine = make_engine(str(folder), {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
                         dtype="float32", max_model_len=40)
    assert engine.target.lm.max_context == 40
    out = engine.generate([[3, 4, 5, 3, 4, 5, 3, 4]], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert 8 + len(out.token_ids) <= 40 and out.finish_reason == "length"
    with pytest.raises(PromptError, match="the context max_model_len sets is 40 tokens"):
        engine.generate([list(range(3, 45))], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="max_model_len = 129 exceeds the model's context of 128 tokens"):
        make_engine(str(folder), None, dtype="float32", max_model_len=129)
    with pytest.raises(ValueError, match="max_model_len = 0 must be a whole number"):
        make_engine(str(folder), None, dtype="float32", max_model_len=0)
    assert make_engine(str(folder), None, dtype="float32", max_model_len=-1).target.lm.max_context == 128  # vLLM's auto


def test_generate_names_the_prompt_and_the_room_min_tokens_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from specsure.cli.main import main

    assert main(["generate", "--max-model-len", "4", "Hello there, how are you"]) == 2
    assert "error: the prompt has 6 tokens, but the context max_model_len sets is 4 tokens" in capsys.readouterr().err
    assert main(["generate", "--max-model-len", "20", "--min-tokens", "18", "Hello there, how are you"]) == 2
    assert "--min-tokens 18 does not fit: the context max_model_len sets is 20 tokens and the prompt takes 6, so at " \
           "most 14 more fit" in capsys.readouterr().err
