"""Run probe.py under vLLM's Python and parse its answer. Never imports vLLM itself."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Final, Mapping, Sequence

from specsure.config.export import VLLM_TESTED_VERSIONS

PROBE: Final[Path] = Path(__file__).with_name("probe.py")
MARKER: Final[str] = "SPECSURE_PROBE_RESULT "
DEFAULT_VLLM_PYTHON: Final[str] = ".venv-vllm/bin/python"
STDERR_TAIL: Final[int] = 2000


class ProbeError(RuntimeError):
    """vLLM is missing, did not import, or its probe gave no answer (the CLI exits 2)."""


def default_vllm_python() -> str | None:
    """``.venv-vllm/bin/python`` under the current directory, when it exists."""
    path = Path(DEFAULT_VLLM_PYTHON)
    return str(path) if path.is_file() else None


def run_probe(python: str, cases: Sequence[Mapping[str, Any]], timeout: float = 600.0) -> dict[str, Any]:
    """Resolve each case ({"model", "speculative_config"}) with vLLM's own config code.

    Returns {"vllm_version", "results": [one dict per case]}; a case that vLLM rejects has
    an "error" key. Raises ProbeError when there is no usable answer at all.
    """
    if not Path(python).is_file():
        raise ProbeError(f"no Python at {python!r}. Give --vllm-python, the interpreter of an environment "
                         f"with vLLM installed (make test-vllm creates .venv-vllm with vllm=={VLLM_TESTED_VERSIONS[-1]}).")
    try:
        # check-vllm reports vLLM's own resolution; specsure's plugin, if installed there, would
        # otherwise answer with specsure's (the probe says whether it is installed).
        done = subprocess.run([python, str(PROBE)], input=json.dumps(list(cases)), capture_output=True,
                              text=True, timeout=timeout, check=False,
                              env={**os.environ, "SPECSURE_VLLM_PLUGIN": "off"})
    except subprocess.TimeoutExpired:
        raise ProbeError(f"vLLM's config probe did not finish within {timeout:.0f} s ({python}); vLLM's first "
                         "import can take minutes on a cold cache: pass a larger --timeout.") from None
    except OSError as exc:
        raise ProbeError(f"cannot run {python!r}: {exc.strerror or exc}.") from None
    answer = _parse(done.stdout)
    if answer is None:
        # its lines joined on one: an error here is one paragraph, where a line break would print as \n
        tail = " | ".join(line.strip() for line in done.stderr[-STDERR_TAIL:].splitlines() if line.strip())
        raise ProbeError(f"vLLM's config probe exited {done.returncode} without an answer ({python}). "
                         f"Its last output: {tail or '(none)'}")
    if "import_error" in answer:
        raise ProbeError(f"vLLM is not usable under {python}: import vllm failed with {answer['import_error']}. "
                         f"Install it there: pip install vllm=={VLLM_TESTED_VERSIONS[-1]}")
    results = answer.get("results")
    if not (isinstance(results, list) and len(results) == len(cases) and all(isinstance(r, dict) for r in results)):
        raise ProbeError(f"vLLM's config probe under {python} answered without one result per case "
                         f"({len(cases)} asked); is {python!r} running specsure's probe.py?")
    return answer


def _parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None
