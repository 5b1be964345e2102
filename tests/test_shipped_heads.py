"""The heads shipped for the default model: resolution fills them in, says so, and they run exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specsure import SamplingParams, make_engine
from specsure.bench.configs import Settings, speculative_config
from specsure.config import ConfigError, resolve
from specsure.config import shipped
from specsure.config.checkpoint import default_gguf_path
from specsure.config.shipped import HEADS_DIR, SHIPPED, shipped_head
from specsure.config.training_record import trained_depth

HEAD_BYTES_LIMIT = 30 * 1024 * 1024
"""The issue's bound on the committed heads, all together."""


def test_the_shipped_heads_are_committed_small_and_documented() -> None:
    total = 0
    for method, name in SHIPPED.items():
        folder = HEADS_DIR / name
        assert shipped_head(method) == str(folder)
        total += sum(f.stat().st_size for f in folder.iterdir())
        training = json.loads((folder / "training.json").read_text())
        assert training["method"] == method and training["data"]["sources"]
        assert all(s["licence"] for s in training["data"]["sources"])
    assert total <= HEAD_BYTES_LIMIT


def test_make_heads_expects_the_data_the_shipped_heads_record() -> None:
    """`make heads` warns when its data is not the shipped heads' (HEADS_DATA): that digest must be theirs."""
    root = Path(__file__).resolve().parents[1]
    makefile, pins = (root / "Makefile").read_text(), (root / "heads-constraints.txt").read_text().split()
    expected = re.search(r"^HEADS_DATA := ([0-9a-f]{64})$", makefile, re.MULTILINE)
    assert expected, "the Makefile no longer sets HEADS_DATA"
    for name in SHIPPED.values():
        data = json.loads((HEADS_DIR / name / "training.json").read_text())["data"]
        assert data["tokens_sha256"] == expected.group(1)
        assert f"transformers=={data['environment']['transformers']}" in pins  # the version that made them


@pytest.mark.parametrize("method", sorted(SHIPPED))
@pytest.mark.parametrize("bf16", [("avx512_bf16",), ()])
def test_an_unset_model_on_the_default_target_is_the_shipped_head(method: str, bf16: tuple[str, ...],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipped, "cpu_bf16_flags", lambda: bf16)  # the CPU decides the default tree
    monkeypatch.setattr(shipped, "auto_dtype", lambda gguf: ("bfloat16", ""))  # as where the float32 kernel cannot run
    res = resolve({"method": method})
    model = res.decisions["model"]
    assert model.value == shipped_head(method) and model.source == "default" and "shipped" in model.reason
    tree, k = res.decisions["speculative_token_tree"], res.decisions["num_speculative_tokens"]
    want = shipped.TREE_FAST_BF16 if bf16 else shipped.TREE_FLOAT32
    assert want == (((0,), (1,)) if bf16 else ((0,),))
    assert tree.value == want and tree.source == "default" and "shipped" in tree.reason
    assert ("fast bf16 (avx512_bf16)" if bf16 else "reports no fast bf16") in tree.reason
    assert k.value == len(want) and k.source == "derived"
    assert "shipped" in res.explain() and not res.warnings
    exported = resolve({"method": method}, dtype=None)  # for another engine: the same on every CPU
    assert exported.config.speculative_token_tree == shipped.TREE_FAST_BF16
    assert "another engine" in exported.reason("speculative_token_tree")
    given = resolve({"method": method}, dtype="float32")  # the dtype that runs decides, not the CPU alone
    assert given.config.speculative_token_tree == shipped.TREE_FLOAT32
    assert "dtype 'float32' was given" in given.reason("speculative_token_tree")
    emulated = resolve({"method": method}, dtype="bfloat16").config.speculative_token_tree
    assert emulated == (shipped.TREE_FAST_BF16 if bf16 else shipped.TREE_FLOAT32)
    with pytest.raises(ConfigError, match="dtype = 'fp8' is not one of auto, float32, bfloat16, float16"):
        resolve({"method": method}, dtype="fp8")
    chain = resolve({"method": method, "num_speculative_tokens": 2})  # an explicit k drafts a chain of k
    assert chain.config.num_speculative_tokens == 2 and chain.config.speculative_token_tree is None
    assert chain.reason("speculative_token_tree").startswith("You set num_speculative_tokens, so the draft is a chain")
    mine = resolve({"method": method, "speculative_token_tree": "[(0,), (1,)]"})
    assert mine.config.speculative_token_tree == ((0,), (1,)) and mine.source("speculative_token_tree") == "user"


def test_an_explicit_model_or_another_target_never_gets_a_shipped_head(tiny_llama: Path, tmp_path: Path) -> None:
    mine = resolve({"method": "mtp", "model": shipped_head("eagle3")})  # the user's value, even a wrong one
    assert mine.decisions["model"].source == "user"
    assert resolve({"method": "mtp", "model": None}).decisions["model"].value is None
    with pytest.raises(ConfigError, match="needs 'model'"):
        resolve({"method": "eagle3"}, model=str(tiny_llama))
    settings = Settings(model=None, dtype="float32", num_speculative_tokens=8)
    assert speculative_config("eagle3", settings) == {"method": "eagle3"}
    assert speculative_config("mtp", Settings(model=None, dtype="float32", num_speculative_tokens=8, head_k=2)) == {
        "method": "mtp", "num_speculative_tokens": 2}
    with pytest.raises(LookupError, match="--eagle3-head"):
        speculative_config("eagle3", Settings(model=str(tiny_llama), dtype="float32", num_speculative_tokens=8))


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(SHIPPED))
@pytest.mark.parametrize("tree", [None, str(shipped.TREE_FAST_BF16)])  # the float32 default, and the bf16 one
def test_the_shipped_heads_equal_plain_decoding_in_float32(default_model_cache: Path, method: str,
                                                           tree: str | None) -> None:
    spec = make_engine(None, {"method": method, **({"speculative_token_tree": tree} if tree else {})}, dtype="float32")
    plain = make_engine(None, None, dtype="float32")
    prompts = [spec.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
               for text in ("Give me two tips for learning to cook.", "Write a Python function that adds two numbers.")]
    params = SamplingParams(max_tokens=40, temperature=0.0)
    got = spec.generate(prompts, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in plain.generate(prompts, params)]
    assert sum(c.stats.accepted_tokens for c in got) > 0  # the head's drafts were verified, and some kept


def _head_with_record(tmp_path: Path, record: str) -> str:
    """The shipped EAGLE-3 head's files next to a training.json of our own."""
    folder = tmp_path / "head"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(HEADS_DIR / SHIPPED["eagle3"] / name)
    (folder / "training.json").write_text(record)
    return str(folder)


def test_a_draft_deeper_than_the_head_was_trained_for_is_explained(tmp_path: Path) -> None:
    # make heads continues the EAGLE-3 head at three unrolled steps; the MTP head is trained for one
    assert trained_depth(shipped_head("eagle3")) == 3 and trained_depth(shipped_head("mtp")) == 1
    assert "trained for" not in resolve({"method": "mtp"}).reason("num_speculative_tokens")
    assert "trained for" not in resolve({"method": "eagle3", "num_speculative_tokens": 3}).reason(
        "num_speculative_tokens")
    assert "trained for 3 draft steps" in resolve({"method": "eagle3", "num_speculative_tokens": 4}).reason(
        "num_speculative_tokens")
    chain = resolve({"method": "mtp", "num_speculative_tokens": 3})
    assert "The head was trained for 1 draft step" in chain.reason("num_speculative_tokens")
    assert chain.config.num_speculative_tokens == 3 and not chain.warnings  # a note; the config runs as given
    deep_tree = resolve({"method": "mtp", "speculative_token_tree": "[(0,), (0, 0)]"})
    assert "--unroll 2" in deep_tree.reason("num_speculative_tokens")
    three = _head_with_record(tmp_path, json.dumps({"settings": {"unroll": 3}}))
    assert "trained for" not in resolve({"method": "eagle3", "model": three, "num_speculative_tokens": 3}).reason(
        "num_speculative_tokens")
    assert "trained for 3 draft steps" in resolve({"method": "eagle3", "model": three, "num_speculative_tokens": 4}
                                                  ).reason("num_speculative_tokens")
    (tmp_path / "head" / "training.json").write_text("{not json")  # documentation only: nothing to say, no error
    assert trained_depth(three) is None
    assert "trained for" not in resolve({"method": "eagle3", "model": three, "num_speculative_tokens": 4}).reason(
        "num_speculative_tokens")


def test_mtp_on_the_default_model_through_a_link_in_an_eagle_folder_gives_no_warning(tmp_path: Path) -> None:
    # mtp without 'model' drafts with the shipped MTP head there, whose metadata agrees; the link's
    # folder name is no evidence against it (it was read as the target's, before the head was chosen)
    default = default_gguf_path()
    assert default is not None and shipped_head("mtp") is not None
    link = tmp_path / "eagle-models" / "smollm2.gguf"
    link.parent.mkdir()
    link.symlink_to(default)
    res = resolve({"method": "mtp"}, model=str(link), strict=True)
    assert res.warnings == () and res.config.model == shipped_head("mtp") and res.source("model") == "default"
