"""Loading target and draft models, and running them with an exactly-rollbackable KV cache."""

from specsure.models.causal_lm import CausalLM, ForwardOutput
from specsure.models.errors import ModelLoadError
from specsure.models.loading import LoadedModel, load_model

__all__ = ["CausalLM", "ForwardOutput", "LoadedModel", "ModelLoadError", "load_model"]
