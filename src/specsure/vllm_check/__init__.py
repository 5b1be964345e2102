"""Ask an installed vLLM what it would run for specsure's exported config, and compare.

vLLM is never imported here: ``probe.py`` runs under vLLM's own Python in a subprocess
(runner.py), and compare.py turns its answer into a field-by-field verdict with causes.
"""

from specsure.vllm_check.compare import Check, Mismatch, Row, compare
from specsure.vllm_check.runner import ProbeError, default_vllm_python, run_probe

__all__ = ["Check", "Mismatch", "ProbeError", "Row", "compare", "default_vllm_python", "run_probe"]
