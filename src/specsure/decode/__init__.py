"""Decoding: the engine, its scheduler and requests, the verifier (chains and trees), metrics and the
text a stream adds; sampling itself is `specsure.sampling`."""
