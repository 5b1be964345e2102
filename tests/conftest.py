"""Shared test settings and fixtures: thread count, tiny random checkpoints, one persistent
cache for the default model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest
import torch

from tiny import build_tiny_llama


@pytest.fixture(autouse=True)
def _threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """One thread for tiny-model tests (thread sync dominates tiny ops); all cores for the real model."""
    before = torch.get_num_threads()
    torch.set_num_threads(before if request.node.get_closest_marker("slow") else 1)
    yield
    torch.set_num_threads(before)


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
