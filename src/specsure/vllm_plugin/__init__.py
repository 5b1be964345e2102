"""The vLLM general plugin: vLLM runs the speculative method and draft the user configured, or refuses.

Installed with specsure (entry point ``vllm.general_plugins: specsure =
specsure.vllm_plugin:register``), vLLM calls ``register`` in every process it starts. The plugin
resolves the user's speculative config with specsure's rules, hands vLLM a fully explicit
config (neutral links where vLLM's path test would misfire), logs the effective config with each
field's source, and stops vLLM when it would still run something else. ``SPECSURE_VLLM_PLUGIN``:
``strict``, ``enforce`` (default), ``warn`` or ``off``. Imports specsure.config and vLLM only; no torch of its own.
"""

from __future__ import annotations

from specsure.vllm_plugin.patch import PluginRefusal, install, mode

__all__ = ["PluginRefusal", "register"]


def register() -> None:
    """vLLM's entry point: wrap its speculative-config code once per process (idempotent)."""
    try:
        chosen = mode()
    except ValueError:
        # vLLM marks its plugins loaded before it calls them, so raising here first would leave a
        # process that retries (a notebook, a service) unguarded: wrap, then raise; every config the
        # wrappers see raises the same error until the variable names a mode.
        chosen = None
    if chosen == "off":
        return
    import vllm
    from vllm.engine import arg_utils

    install(arg_utils.EngineArgs, arg_utils, str(getattr(vllm, "__version__", "unknown")))
    if chosen is None:
        mode()
