"""Decoding: sampling params, the verifier, metrics and the engine loop."""
