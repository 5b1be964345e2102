"""Prefix caching: a request reuses the start of its prompt that an earlier request left in a slot's
KV cache, computes only the rest, and generates exactly what a fresh engine generates (float32),
whatever the method (heads reuse only their own slot's); the server reports the cached tokens."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch
from heads import build_mtp_target, write_eagle3_head, write_eagle_head
from serving import NGRAM, build_tiny_chat_model, metric, serving

from specsure import SamplingParams, make_engine
from specsure.decode.engine import Engine
from specsure.models.causal_lm import Call
from specsure.models.loading import load_model
from specsure.models.token_tree import TokenTree
from specsure.serve import create_app
from test_batching import METHODS as BATCHED
from tiny import build_tiny_llama

SHAPE = dict(vocab_size=96, hidden_size=48, num_layers=3)
METHODS = {name: BATCHED[name] for name in ("plain", "ngram", "ngram-tree", "suffix", "draft_model")}
"""The methods that reuse a cached prefix: their drafters read token ids, not the target's features."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prefix")
    target = build_tiny_llama(root / "target", seed=0, **SHAPE)
    return {"target": target, "draft": build_tiny_llama(root / "draft", seed=3, **SHAPE),
            "eagle3": write_eagle3_head(root / "eagle3", target, draft_vocab=64),
            "eagle": write_eagle_head(root / "eagle", target),
            "mtp_target": build_mtp_target(root / "mtp", modules=1, num_layers=3, vocab_size=96, hidden_size=48),
            "mtp2_target": build_mtp_target(root / "mtp2", modules=2, num_layers=3, vocab_size=96, hidden_size=48)}


def _engine(folders: dict[str, Path], name: str, caching: bool, max_num_seqs: int = 4) -> Engine:
    spec = METHODS[name]
    if spec is not None and "model" in spec:
        spec = {**spec, "model": str(folders[spec["model"]])}
    return make_engine(str(folders["target"]), spec, dtype="float32", max_num_seqs=max_num_seqs,
                       enable_prefix_caching=caching)


def _conversation(seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 96, (5,), generator=gen).tolist()
    return base * 3 + torch.randint(3, 96, (4,), generator=gen).tolist()


@pytest.mark.parametrize("name", list(METHODS))
def test_a_next_turn_reuses_the_cache_and_generates_what_a_fresh_engine_does(folders: dict[str, Path],
                                                                          name: str) -> None:
    params = SamplingParams(max_tokens=14, ignore_eos=True)
    cached, fresh = _engine(folders, name, True), _engine(folders, name, False)
    prompt = _conversation(0)
    for turn in range(3):
        got, want = cached.generate(prompt, params)[0], fresh.generate(prompt, params)[0]
        assert got.token_ids == want.token_ids and want.cached_tokens == 0
        if turn:
            # The slot holds the earlier prompt and its output but the last token (not yet fed), or all of it
            # when the last step's bonus token was cut at max_tokens.
            assert len(prompt) - len(extra) - 1 <= got.cached_tokens <= len(prompt) - len(extra)
        extra = [7, 8, 9]
        prompt = prompt + got.token_ids + extra


@pytest.mark.parametrize("name", ["ngram", "ngram-tree", "suffix"])
def test_batched_requests_with_shared_starts_generate_what_they_generate_alone(folders: dict[str, Path],
                                                                             name: str) -> None:
    # Several conversations, admitted as slots free up, each continued after its first answer: a
    # request may land in a slot another conversation used, and must reuse only what truly matches.
    params = [SamplingParams(max_tokens=8 + 3 * (i % 3), ignore_eos=True) for i in range(6)]
    starts = [_conversation(i % 3) + [10 + i] * (i % 2) for i in range(6)]
    alone = _engine(folders, name, False, max_num_seqs=1)
    engine = _engine(folders, name, True, max_num_seqs=3)
    first = engine.generate(starts, params)
    assert [c.token_ids for c in first] == [alone.generate(p, sp)[0].token_ids for p, sp in zip(starts, params)]
    later = [p + c.token_ids + [11, 12] for p, c in zip(starts, first)]
    second = engine.generate(later, params)
    assert [c.token_ids for c in second] == [alone.generate(p, sp)[0].token_ids for p, sp in zip(later, params)]
    assert sum(c.cached_tokens for c in second) > 0
    for completion, prompt in zip(second, later):
        assert completion.cached_tokens < len(prompt)


def test_conversations_taking_turns_each_keep_a_slot(folders: dict[str, Path]) -> None:
    # One request at a time, and still max_num_seqs conversations stay cached: a prompt that continues
    # no free slot's cache takes a new slot while there are fewer than max_num_seqs, then the least
    # recently used, and starts with the longest start of it any slot holds (a shared system prompt).
    engine = _engine(folders, "ngram", True, max_num_seqs=2)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    system = [1, 2, 3, 4]
    talks = {"a": system + _conversation(3), "b": system + _conversation(4), "c": _conversation(5)}
    common = next(i for i, (x, y) in enumerate(zip(talks["a"], talks["b"])) if x != y)
    seen = []
    for name in ("a", "b", "a", "b", "c", "b", "a"):
        done = engine.generate(talks[name], params)[0]
        seen.append("turn" if done.cached_tokens >= len(talks[name]) - 8 else done.cached_tokens)
        talks[name] = talks[name] + done.token_ids + [9]
    # c takes a's slot (the least recently used), so b keeps its cache; a then starts from the system
    # prompt, copied from b's slot into the one c used.
    assert seen == [0, common, "turn", "turn", 0, "turn", common] and common >= len(system)
    assert engine.scheduler.slots.count == 2


def test_the_draft_model_keeps_its_own_cache_too(folders: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(folders, "draft_model", True, max_num_seqs=1)
    draft = engine.proposer.draft
    fed: list[int] = []
    forward_batch = type(draft).forward_batch

    def counting(self, calls, **kwargs):  # noqa: ANN001, ANN202
        if self.hf is draft.hf:
            fed.extend(len(c.token_ids) for c in calls)
        return forward_batch(self, calls, **kwargs)

    monkeypatch.setattr(type(draft), "forward_batch", counting)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    prompt = _conversation(6)
    done = engine.generate(prompt, params)[0]
    assert fed[0] == len(prompt) + 1  # the first proposal feeds the draft model the prompt and the pending token
    fed.clear()
    longer = prompt + done.token_ids + [5, 6]
    again = engine.generate(longer, params)[0]
    assert again.token_ids == _engine(folders, "draft_model", False).generate(longer, params)[0].token_ids
    assert fed[0] <= len(longer) + 1 - len(prompt)  # then only what it has not seen


HEADS = {"eagle3": {"method": "eagle3", "model": "eagle3", "num_speculative_tokens": 2},
         "eagle3-tree": {"method": "eagle3", "model": "eagle3", "speculative_token_tree": "[(0,), (1,), (0, 0)]"},
         "eagle": {"method": "eagle", "model": "eagle", "num_speculative_tokens": 3},
         "mtp": {"method": "mtp", "num_speculative_tokens": 2},
         "mtp-2": {"method": "mtp", "num_speculative_tokens": 2}}
"""Heads keep the entries the shared tokens still make, in their own slot; MTP with two modules keeps none."""


def _head_engine(folders: dict[str, Path], name: str, caching: bool, max_num_seqs: int = 2) -> Engine:
    spec = dict(HEADS[name])
    if "model" in spec:
        spec["model"] = str(folders[spec["model"]])
    target = folders["mtp_target"] if name == "mtp" else folders["mtp2_target"] if name == "mtp-2" \
        else folders["target"]
    return make_engine(str(target), spec, dtype="float32", max_num_seqs=max_num_seqs, enable_prefix_caching=caching)


@pytest.mark.parametrize("name", list(HEADS))
def test_heads_reuse_their_own_slot_and_generate_what_a_fresh_engine_does(folders: dict[str, Path],
                                                                       name: str) -> None:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    cached, fresh = _head_engine(folders, name, True), _head_engine(folders, name, False)
    talks = [_conversation(7), _conversation(8)]
    for turn in range(3):
        for i, prompt in enumerate(talks):
            got, want = cached.generate(prompt, params)[0], fresh.generate(prompt, params)[0]
            assert got.token_ids == want.token_ids, (turn, i)
            if name == "mtp-2" or turn == 0:
                assert got.cached_tokens == 0
            else:  # all but the last token the head paired with one that changed
                assert got.cached_tokens >= len(prompt) - 6
            talks[i] = prompt + got.token_ids + [9, 10]
    assert cached.stats.drafts > 0


@pytest.mark.parametrize("name", ["eagle3", "mtp"])
def test_heads_reuse_a_regenerated_or_resent_prompt(folders: dict[str, Path], name: str) -> None:
    """The same prompt again, or resent with more: the slot that holds it is reused, not a new one."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    cached, fresh = _head_engine(folders, name, True, max_num_seqs=4), _head_engine(folders, name, False)
    prompt = _conversation(11)
    first = cached.generate(prompt, params)[0]
    for again in (prompt, prompt + [7, 8, 9]):
        got = cached.generate(again, params)[0]
        assert got.token_ids == fresh.generate(again, params)[0].token_ids
        assert got.cached_tokens >= len(prompt) - 6 > 0, (got.cached_tokens, len(prompt))
    assert first.cached_tokens == 0 and cached.scheduler.slots.count == 1


def test_heads_keep_each_conversations_slot_when_they_share_a_system_prompt(folders: dict[str, Path]) -> None:
    """Taking a slot whose cache is mostly another conversation would make both recompute their turns."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine = _head_engine(folders, "eagle3", True, max_num_seqs=4)
    system = torch.randint(3, 96, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    talks = {"a": system + [10, 11, 12, 13], "b": system + [20, 21, 22, 23]}
    for turn in range(3):
        for name in "ab":
            done = engine.generate(talks[name], params)[0]
            if turn:  # its own slot: all but the head's last pair
                assert done.cached_tokens >= len(talks[name]) - 6, (turn, name, done.cached_tokens)
            talks[name] = talks[name] + done.token_ids + [40 + turn, 41, 42, 43]


def test_scoring_the_prompt_computes_it_whole_and_evicts_no_conversation(folders: dict[str, Path]) -> None:
    engine = _engine(folders, "ngram", True)
    prompt = _conversation(2)
    done = engine.generate(prompt, SamplingParams(max_tokens=4))[0]
    scored = engine.generate(prompt + [5], SamplingParams(max_tokens=4, prompt_logprobs=1))[0]
    assert scored.cached_tokens == 0 and len(scored.prompt_logprobs) == len(prompt) + 1
    # The scored prompt took a slot of its own: the conversation is still cached.
    assert engine.generate(prompt + done.token_ids + [6], SamplingParams(max_tokens=4))[0].cached_tokens > len(prompt)


@pytest.mark.parametrize("name", ["eagle3", "mtp", "ngram"])
def test_choices_that_share_a_prefill_on_a_later_turn(folders: dict[str, Path], name: str) -> None:
    # n choices: a sibling that joins with its leader copies the leader's prefill; a head takes it
    # only from the same cached start, else it prefills itself.
    make = (lambda c: _head_engine(folders, name, c, max_num_seqs=4)) if name in HEADS else \
        (lambda c: _engine(folders, name, c, max_num_seqs=4))
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    runs = {}
    for caching in (False, True):
        engine = make(caching)
        prompt = _conversation(9)
        prompt = prompt + engine.generate(prompt, params)[0].token_ids + [9, 10]
        leader, sibling = engine.request(prompt, params), engine.request(prompt, params)
        sibling.prefill_from = leader
        engine.scheduler.add(leader)
        engine.scheduler.add(sibling)
        errors = []
        while not engine.scheduler.idle:
            errors += [u.error for _, u in engine.scheduler.step() if u.error is not None]
        assert not errors
        runs[caching] = [leader.completion.token_ids, sibling.completion.token_ids]
        if caching:
            assert leader.completion.cached_tokens > 0
    assert runs[True] == runs[False] and runs[True][0] == runs[True][1]


def test_the_cache_knows_its_tokens_through_crops_trees_and_copies(folders: dict[str, Path]) -> None:
    lm = load_model(str(folders["target"]), dtype="float32").lm
    lm.forward([5, 6, 7, 8])
    assert list(lm.cached_ids) == [5, 6, 7, 8]
    lm.crop(2)
    assert list(lm.cached_ids) == [5, 6]
    lm.forward([9, 10, 11, 12], tree=TokenTree.from_parents([-1, 0, 0, 2]))  # 9 -> (10 | 11 -> 12)
    lm.keep(2, [0, 2, 3])
    assert list(lm.cached_ids) == [5, 6, 9, 11, 12]
    twin = lm.fork()
    assert list(twin.cached_ids) == []
    lm.forward_batch([Call(lm, [13]), Call(twin, [20, 21])])
    assert list(lm.cached_ids) == [5, 6, 9, 11, 12, 13] and list(twin.cached_ids) == [20, 21]
    twin.copy_cache(lm)
    assert list(twin.cached_ids) == list(lm.cached_ids)
    lm.reset()
    assert list(lm.cached_ids) == [] and len(twin.cached_ids) == 6


def test_the_server_reports_cached_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = build_tiny_chat_model(tmp_path_factory.mktemp("prefix-serve"))
    engine = make_engine(str(folder), NGRAM, dtype="float32", enable_prefix_caching=True)
    with serving(create_app(engine, served_model_name="tiny")) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        messages = [{"role": "system", "content": "w1 w2 w3 w4"}, {"role": "user", "content": "w5 w6 w7 w8 w5 w6"}]
        first = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "w9 w10"}]
        second = sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
        hits = second.usage.prompt_tokens_details.cached_tokens
        assert 0 < hits < second.usage.prompt_tokens
        response = sdk.responses.create(model="tiny", input="w5 w6 w7", max_output_tokens=4)
        later = sdk.responses.create(model="tiny", input="w8", max_output_tokens=4, previous_response_id=response.id)
        assert later.usage.input_tokens_details.cached_tokens > 0
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "vllm:prefix_cache_hits_total") == hits + later.usage.input_tokens_details.cached_tokens + \
            response.usage.input_tokens_details.cached_tokens  # the template's first token, shared with the chat's
        assert metric(text, "vllm:prefix_cache_queries_total") == (
            first.usage.prompt_tokens + second.usage.prompt_tokens + response.usage.input_tokens
            + later.usage.input_tokens)


def test_serve_turns_it_on_and_the_flag_turns_it_off() -> None:
    from specsure.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).enable_prefix_caching is True
    assert parser.parse_args(["serve", "--no-enable-prefix-caching"]).enable_prefix_caching is False
