"""OpenAI-compatible HTTP serving over one Engine (``specsure serve``); see docs/serving.md."""

from specsure.serve.app import create_app, default_model_name

__all__ = ["create_app", "default_model_name"]
