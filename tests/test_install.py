"""`pip install specsure` brings no torch; the config commands run there, the engine commands say what to add.

The package is built as a wheel and installed with `--no-index` into a new virtual environment,
so the install fails if it declares any dependency at all.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import llama, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str | Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def _setuptools_builds_here() -> bool:
    # pyproject's SPDX licence string needs setuptools >= 77; an older one means building in isolation.
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    return int(setuptools.__version__.split(".")[0]) >= 77


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv holding only specsure, installed from a freshly built wheel with no index."""
    tmp = tmp_path_factory.mktemp("install")
    flags = ["--no-build-isolation"] if _setuptools_builds_here() else []
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *flags, "-w", tmp / "wheels", ROOT)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp / "wheels").glob("specsure-*.whl"))
    venv = tmp / "venv"
    made = _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    installed = _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", wheel)
    assert installed.returncode == 0, installed.stderr  # --no-index: any declared dependency fails here
    return venv


@pytest.mark.slow
def test_the_bare_install_has_no_torch_and_no_dependencies(bare_venv: Path) -> None:
    listed = _run(bare_venv / "bin" / "python", "-m", "pip", "list", "--format", "json")
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "specsure" in names and not names & {"torch", "transformers", "safetensors", "numpy", "tokenizers"}
    probe = _run(bare_venv / "bin" / "python", "-c", "import importlib.util as u; print(u.find_spec('torch'))")
    assert probe.stdout.strip() == "None"


@pytest.mark.slow
def test_explain_and_export_run_without_the_engine(bare_venv: Path, tmp_path: Path) -> None:
    target = write_checkpoint(tmp_path / "target", llama(layers=4))
    draft = write_checkpoint(tmp_path / "draft", llama(layers=2))
    spec = json.dumps({"model": str(draft)})
    explained = _run(bare_venv / "bin" / "specsure", "explain", "--model", target, "--speculative-config", spec)
    assert explained.returncode == 0, explained.stderr
    assert "draft_model" in explained.stdout and "checkpoint" in explained.stdout
    exported = _run(bare_venv / "bin" / "specsure", "export", "--to", "vllm", "--model", target,
                    "--speculative-config", spec)
    assert exported.returncode == 0, exported.stderr
    assert '"method": "draft_model"' in exported.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("command", "extra"), [("generate", "engine"), ("serve", "serve"), ("bench", "bench"),
                                                ("train", "train")])
def test_engine_commands_name_the_extra_to_install(bare_venv: Path, command: str, extra: str) -> None:
    done = _run(bare_venv / "bin" / "specsure", command, "--model", "/nowhere", "hello")
    assert done.returncode == 2
    assert f"pip install 'specsure[{extra}]'" in done.stderr and "torch" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_help_lists_every_command_and_the_python_api_names_the_extra(bare_venv: Path) -> None:
    helped = _run(bare_venv / "bin" / "specsure", "--help")
    assert helped.returncode == 0 and "serve" in helped.stdout and "specsure[serve]" in helped.stdout
    api = _run(bare_venv / "bin" / "python", "-c", "import specsure; specsure.make_engine")
    assert api.returncode == 1 and "pip install 'specsure[engine]'" in api.stderr
