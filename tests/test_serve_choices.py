"""n > 1 choices and logprobs on both endpoints, streamed and not, read with the official client."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest

from serving import CHAT, WORDS, serving, tiny_chat_engine
from specsure.decode.engine import Engine
from specsure.serve import create_app


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return tiny_chat_engine(tmp_path_factory, "tiny-chat-choices")


@pytest.fixture(scope="module")
def sdk(engine: Engine) -> Iterator[openai.OpenAI]:
    with serving(create_app(engine, served_model_name="tiny")) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_streamed_equal_whole(sdk: openai.OpenAI) -> None:
    args = dict(model="tiny", prompt=WORDS, max_tokens=12, logprobs=3, extra_body={"ignore_eos": True})
    whole = sdk.completions.create(**args).choices[0]
    lp = whole.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(whole.model_extra["token_ids"])
    assert all(v <= 0 for v in lp.token_logprobs) and "".join(lp.tokens) == whole.text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # Greedy: the chosen token is the most likely, so it is one of the 3 alternatives.
        assert 1 <= len(top) <= 4 and top[token] == value == max(top.values())
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    chunks = list(sdk.completions.create(**args, stream=True))
    joined = [(t, v) for c in chunks if c.choices and c.choices[0].logprobs
              for t, v in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs)]
    assert joined == list(zip(lp.tokens, lp.token_logprobs))
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_chat_logprobs_and_top_logprobs(sdk: openai.OpenAI) -> None:
    out = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10, logprobs=True, top_logprobs=2,
                                      extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(e.token for e in content) == out.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].token == entry.token and bytes(entry.bytes).decode() == entry.token
    plain = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10, extra_body={"ignore_eos": True})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == out.choices[0].message.content
    streamed = [e for c in sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=10, logprobs=True,
                                                        stream=True, extra_body={"ignore_eos": True})
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert all(e.top_logprobs == [] for e in streamed)


def test_n_choices_share_a_request(sdk: openai.OpenAI) -> None:
    greedy = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=8, n=3, extra_body={"ignore_eos": True})
    assert [c.index for c in greedy.choices] == [0, 1, 2] and len({c.text for c in greedy.choices}) == 1
    one = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=8, extra_body={"ignore_eos": True})
    assert greedy.choices[0].text == one.choices[0].text
    # The prompt counts once, every choice's tokens count.
    assert (greedy.usage.prompt_tokens, greedy.usage.completion_tokens) == (one.usage.prompt_tokens, 24)
    sampled = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, n=4, temperature=1.5, seed=3,
                                          extra_body={"ignore_eos": True})
    texts = [c.message.content for c in sampled.choices]
    assert len(set(texts)) > 1  # seed + i per choice: the choices differ
    again = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, n=4, temperature=1.5, seed=3,
                                        extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == texts  # and a seeded request repeats
    chunks = list(sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, n=4, temperature=1.5,
                                              seed=3, stream=True, stream_options={"include_usage": True},
                                              extra_body={"ignore_eos": True}))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(4)]
    assert streamed == texts
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] * 4 and chunks[-1].usage.completion_tokens == 48
    assert chunks[-1].usage == sampled.usage  # the chat prompt counts once, streamed or not


def test_logprobs_of_tokens_inside_a_character_keep_their_bytes() -> None:
    """A byte-level BPE splits an emoji or a CJK character over tokens: each token's bytes are its own
    (they join to the text's UTF-8), its text is what it completes, and offsets stay inside the text."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from specsure.decode.completion import TokenLogprob
    from specsure.serve.responses import chat_logprobs, completion_logprobs, token_text_of

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["plain words and more plain words"] * 20, vocab_size=300, show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    text = "Emoji: 😀😃 and 日本"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > len(text)  # characters split over several tokens
    entries = [TokenLogprob(i, -0.5, ((i, -0.5),)) for i in ids]
    names = token_text_of(tokenizer)
    lp = completion_logprobs(entries, names)
    assert "".join(lp["tokens"]) == text and max(lp["text_offset"]) <= len(text)
    content = chat_logprobs(entries, names)["content"]
    assert b"".join(bytes(e["bytes"]) for e in content) == text.encode("utf-8")
    assert all(bytes(e["top_logprobs"][0]["bytes"]) == bytes(e["bytes"]) for e in content)


def test_an_output_cut_inside_a_character_ends_before_it() -> None:
    """The bytes of a character that has not fully arrived are left out of the final text, as vLLM
    leaves them, so the text still equals the logprobs' tokens joined (those tokens add "")."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from specsure.decode.completion import TokenLogprob
    from specsure.decode.request import Rules
    from specsure.sampling import SamplingParams
    from specsure.serve.responses import completion_logprobs, token_text_of

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["plain words and more plain words"] * 20, vocab_size=300, show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    ids = tokenizer("Emoji: 😀")["input_ids"]
    cut = ids[:-1]  # the emoji's last byte never arrives
    assert tokenizer.decode(cut).endswith("\ufffd")
    rules = Rules([], tokenizer, 1000)
    text, tokens, finish, _ = rules.detokenize(cut, SamplingParams(max_tokens=len(cut)), "length")
    assert text == "Emoji: " and tokens == cut and finish == "length"
    names = token_text_of(tokenizer)
    assert "".join(completion_logprobs([TokenLogprob(i, -0.5, ((i, -0.5),)) for i in cut], names)["tokens"]) == text
    assert rules.detokenize(ids, SamplingParams(max_tokens=len(ids)), "length")[0] == "Emoji: 😀"


def test_models_retrieve_and_top_k_minus_one(sdk: openai.OpenAI) -> None:
    assert sdk.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        sdk.models.retrieve("other")
    for call in (lambda: sdk.completions.create(model="other", prompt=WORDS, max_tokens=2),
                 lambda: sdk.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}])):
        with pytest.raises(openai.NotFoundError, match="is not served here"):  # 404, as OpenAI and vLLM answer
            call()
    args = dict(model="tiny", prompt=WORDS, max_tokens=4, temperature=1.0, seed=7)
    off = sdk.completions.create(**args, extra_body={"ignore_eos": True, "top_k": -1}).choices[0].text
    assert off == sdk.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text  # -1: off, as 0



def test_logit_bias_from_the_official_client(sdk: openai.OpenAI) -> None:
    one = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=8, extra_body={"ignore_eos": True})
    banned = one.choices[0].model_extra["token_ids"][0]
    biased = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=8, logit_bias={str(banned): -100},
                                    extra_body={"ignore_eos": True})
    assert banned not in biased.choices[0].model_extra["token_ids"]
    assert biased.choices[0].text != one.choices[0].text
    chat = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, logit_bias={str(banned): -100},
                                       extra_body={"ignore_eos": True, "allowed_token_ids": [9, 11, 13]})
    assert chat.usage.completion_tokens == 6
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=4, logit_bias={"token": 1})


def test_several_prompts_in_one_completions_request(sdk: openai.OpenAI) -> None:
    other = "w9 w3 w9 w3 w9"
    args = dict(model="tiny", max_tokens=8, extra_body={"ignore_eos": True})
    alone = [sdk.completions.create(prompt=p, **args) for p in (WORDS, other)]
    both = sdk.completions.create(prompt=[WORDS, other], n=2, **args)
    # vLLM's order: choice j of prompt i has index i * n + j
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert both.usage.prompt_tokens == alone[0].usage.prompt_tokens + alone[1].usage.prompt_tokens
    assert both.usage.completion_tokens == 2 * (alone[0].usage.completion_tokens + alone[1].usage.completion_tokens)
    by_ids = sdk.completions.create(prompt=[[5, 6, 7, 5, 6, 7], [9, 3, 9, 3]], **args)  # token-id prompts too
    assert [c.index for c in by_ids.choices] == [0, 1] and by_ids.usage.prompt_tokens == 10
    texts: dict[int, str] = {}
    usage = None
    for chunk in sdk.completions.create(prompt=[WORDS, other], stream=True, stream_options={"include_usage": True},
                                        **args):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
        usage = chunk.usage or usage
    assert texts == {0: alone[0].choices[0].text, 1: alone[1].choices[0].text}
    assert usage.prompt_tokens == alone[0].usage.prompt_tokens + alone[1].usage.prompt_tokens
    # vLLM's schema has no list that mixes both kinds: a 400 naming prompt, not two answers
    with pytest.raises(openai.BadRequestError, match=r"prompt mixes strings and token-id lists \(prompt\[0\] is a "
                                                     r"JSON string, prompt\[1\] a JSON array\)"):
        sdk.completions.create(prompt=[WORDS, [5, 6]], **args)


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(sdk: openai.OpenAI, engine: Engine) -> None:
    import torch

    # lm-evaluation-harness's loglikelihood request to a completions server
    out = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=1, logprobs=1, echo=True, temperature=0,
                                 seed=1234).choices[0]
    plain = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=1).choices[0]
    ids = engine.encode(WORDS)
    lp = out.logprobs
    assert out.text == WORDS + plain.text and len(lp.tokens) == len(ids) + 1 and "".join(lp.tokens) == out.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    with torch.no_grad():
        logp = torch.log_softmax(engine.target.lm.hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    for i in range(1, len(ids)):
        assert abs(lp.token_logprobs[i] - float(logp[i - 1, ids[i]])) < 1e-4
        assert max(lp.top_logprobs[i].values()) == pytest.approx(float(logp[i - 1].max()), abs=1e-4)
    assert lp.text_offset[len(ids)] == len(WORDS)
    chunks = list(sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=1, logprobs=1, echo=True,
                                         stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.text
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    assert sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=3, echo=True).choices[0].text.startswith(WORDS)
    # max_tokens 0 with echo: the prompt alone, scored (vLLM's echo without generation)
    alone = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=0, logprobs=1, echo=True)
    assert alone.choices[0].text == WORDS and alone.choices[0].logprobs.token_logprobs == lp.token_logprobs[:-1]
    assert alone.choices[0].model_extra["token_ids"] == [] and alone.choices[0].finish_reason == "length"
    assert (alone.usage.prompt_tokens, alone.usage.completion_tokens) == (len(ids), 0)
    figures = alone.model_extra["speculative"]
    assert (figures["generated_tokens"], figures["tokens_per_s"]) == (0, 0.0)  # the token made with it is not counted
    chunks = list(sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=0, logprobs=1, echo=True, stream=True,
                                         stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == WORDS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 0
    with pytest.raises(openai.BadRequestError, match="max_tokens = 0 generates nothing"):
        sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="echo"):
        sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, extra_body={"echo": True})
    with pytest.raises(openai.BadRequestError, match='echo = "yes" must be true or false'):
        sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=2, extra_body={"echo": "yes"})


def test_prompt_logprobs_on_both_endpoints_as_vllm_returns_them(sdk: openai.OpenAI) -> None:
    """vLLM's prompt_logprobs: null first, then {token id: {logprob, rank, decoded_token}}, the prompt's token first."""
    out = sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=2, logprobs=1, echo=True,
                                 extra_body={"prompt_logprobs": 3})
    choice = out.choices[0]
    scored = choice.model_extra["prompt_logprobs"]
    assert scored[0] is None and len(scored) == out.usage.prompt_tokens
    echoed = choice.logprobs.token_logprobs[:out.usage.prompt_tokens]  # the same prompt, scored for echo
    for entry, value, top in zip(scored[1:], echoed[1:], choice.logprobs.top_logprobs[1:out.usage.prompt_tokens]):
        first, *alternatives = entry.items()
        assert first[1]["logprob"] == value and first[1]["rank"] >= 1
        assert 3 <= len(entry) <= 4 and len(top) <= 2  # echo shows logprobs = 1 alternative, plus its own token
        ranked = [v for _, v in alternatives]
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(ranked, ranked[1:]))
        assert (first[1]["rank"] == 1) == (first[1]["logprob"] >= ranked[0]["logprob"])
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())
    chat = sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, extra_body={"prompt_logprobs": 0})
    listed = chat.model_extra["prompt_logprobs"]
    assert listed[0] is None and len(listed) == chat.usage.prompt_tokens and all(len(e) == 1 for e in listed[1:])
    assert "prompt_logprobs" not in sdk.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2).model_extra


@pytest.mark.parametrize(("extra", "words"), [({"prompt_logprobs": 2, "stream": True}, "not available when stream"),
                                              ({"prompt_logprobs": -1}, "is not served here"),
                                              ({"prompt_logprobs": 21}, "from 0 to 20")])
def test_prompt_logprobs_refusals_name_the_field(sdk: openai.OpenAI, extra: dict, words: str) -> None:
    stream = extra.pop("stream", False)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model="tiny", prompt=WORDS, max_tokens=2, stream=stream, extra_body=extra)
    assert words in str(err.value) and err.value.body["param"] == "prompt_logprobs"
