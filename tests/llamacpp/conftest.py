"""Shared setup for the real-llama.cpp bench tests (run by `make test-llama-cpp` only).

Plain `pytest` does not collect this folder: pyproject's norecursedirs names it. The tests
need .venv-llamacpp (llama-cpp-python==0.3.36), which `make llama-cpp` creates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA_CPP_PYTHON = REPO / ".venv-llamacpp" / "bin" / "python"


@pytest.fixture(scope="session")
def llama_cpp_python() -> str:
    if not LLAMA_CPP_PYTHON.is_file():
        pytest.fail(f"{LLAMA_CPP_PYTHON} is missing; run `make llama-cpp`, which creates it.")
    return str(LLAMA_CPP_PYTHON)

LLAMA_SERVER = REPO / ".venv-llamacpp" / "llama-server" / "build" / "bin" / "llama-server"


@pytest.fixture(scope="session")
def llama_server() -> str:
    if not LLAMA_SERVER.is_file():
        pytest.fail(f"{LLAMA_SERVER} is missing; run `make llama-server`, which builds it.")
    return str(LLAMA_SERVER)
