"""vLLM's tokenizer routes, as lm-evaluation-harness's remote tokenizer uses them."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from serving import CHAT, WORDS, tiny_chat_engine
from specsure.decode.engine import Engine
from specsure import SamplingParams
from specsure.serve import create_app


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-tokenizer")


def test_tokenize_detokenize_and_tokenizer_info(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny"))
    info = client.get("/tokenizer_info").json()
    assert "eos_token" in info and info["chat_template"] == engine.tokenizer.chat_template
    assert info["model_max_length"] == engine.target.lm.max_context
    # lm-evaluation-harness's probe and its encode: no special tokens
    r = client.post("/tokenize", json={"prompt": WORDS, "add_special_tokens": False}).json()
    assert r["tokens"] == engine.tokenizer(WORDS, add_special_tokens=False)["input_ids"] and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == engine.target.lm.max_context and r["token_strs"] is None
    spelled = client.post("/tokenize", json={"prompt": WORDS, "return_token_strs": True}).json()
    assert spelled["token_strs"] == engine.tokenizer.convert_ids_to_tokens(spelled["tokens"])
    assert len(spelled["token_strs"]) == spelled["count"] and all(isinstance(t, str) for t in spelled["token_strs"])
    assert client.post("/tokenize", json={"prompt": WORDS}).json()["tokens"] == engine.encode(WORDS)
    chat = client.post("/tokenize", json={"model": "tiny", "messages": CHAT}).json()["tokens"]
    assert chat == engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == engine.tokenizer.decode(r["tokens"])
    partial = [*CHAT, {"role": "tool", "content": "18", "tool_call_id": "c1"}]  # a result without its call
    assert client.post("/tokenize", json={"messages": partial}).status_code == 200  # any part of a chat, as vLLM's
    for route, body, param, words in (
            ("/tokenize", {"prompt": 5}, "prompt", "send a string"),
            ("/tokenize", {}, "prompt", 'send either "prompt"'),
            ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, "add_special_tokens", "true or false"),
            ("/tokenize", {"prompt": "a", "return_token_strs": 1}, "return_token_strs", "true or false"),
            ("/tokenize", {"prompt": "a", "model": "gpt-4"}, "model", "is not served here"),
            ("/tokenize", {"text": "a"}, "text", "unknown field 'text'"),
            ("/detokenize", {"tokens": [1, "x"]}, "tokens", "list of token ids"),
            ("/detokenize", {"tokens": [10**6]}, "tokens", "outside the model's vocabulary")):
        reply = client.post(route, json=body)
        assert reply.status_code == (404 if param == "model" else 400), reply.text  # OpenAI's and vLLM's model_not_found
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_the_api_key_guards_the_tokenizer_routes(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny", api_key="s3cret"))
    assert client.post("/tokenize", json={"prompt": "a"}).status_code == 401
    assert client.get("/tokenizer_info").status_code == 401
    ok = client.post("/tokenize", json={"prompt": "a"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["count"] >= 1
    assert client.get("/health").status_code == 200


def test_a_prefilled_reply_is_continued(engine: Engine) -> None:
    client = TestClient(create_app(engine, served_model_name="tiny"))
    turns = [*CHAT, {"role": "assistant", "content": "w9 w10"}]
    open_turn = {"messages": turns, "add_generation_prompt": False, "continue_final_message": True}
    tokens = client.post("/tokenize", json=open_turn).json()["tokens"]
    assert engine.tokenizer.decode(tokens).endswith("<|im_start|> assistant w9 w10")  # no <|im_end|> after it
    reply = client.post("/v1/chat/completions", json={**open_turn, "max_tokens": 4}).json()
    assert reply["usage"]["prompt_tokens"] == len(tokens)
    ids = engine.generate(tokens, SamplingParams(max_tokens=4))[0].token_ids
    assert reply["choices"][0]["message"]["content"] == engine.tokenizer.decode(ids, skip_special_tokens=True)
    for body, param, words in (
            ({"messages": turns, "continue_final_message": True}, "continue_final_message",
             '"add_generation_prompt": false'),
            ({"messages": turns, "add_generation_prompt": "no"}, "add_generation_prompt", "true or false"),
            ({"messages": turns, "chat_template_kwargs": {"continue_final_message": True}},
             "chat_template_kwargs.continue_final_message", "send it as the request's continue_final_message")):
        for route in ("/tokenize", "/v1/chat/completions"):
            answer = client.post(route, json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (route, answer.text)
            assert words in answer.json()["error"]["message"]
    # A template that does not write the content as given leaves nothing to continue from.
    shouting = TestClient(create_app(engine, served_model_name="tiny",
                                     chat_template="{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"))
    answer = shouting.post("/v1/chat/completions", json={**open_turn, "max_tokens": 2})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "continue_final_message"
