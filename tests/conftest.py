"""Shared fixtures: tiny random checkpoints, and one persistent cache for the default model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from specsure.models.testing import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LlamaForCausalLM folder (vocab 128, hidden 32, 2 layers, tied, no tokenizer)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def default_model_cache() -> Iterator[Path]:
    """Point XDG_CACHE_HOME at a cache that outlives the test run.

    Converting the packaged GGUF costs ~15-20 s, so the suite converts it once per machine,
    not once per run. Set SPECSURE_TEST_CACHE to choose the folder.
    """
    folder = Path(os.environ.get("SPECSURE_TEST_CACHE", "/tmp/specsure-test-cache"))
    folder.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(folder))
        yield folder
