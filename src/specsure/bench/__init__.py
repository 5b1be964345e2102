"""Spec-Bench-style benchmarking of specsure's methods against Hugging Face transformers.

Workloads (`workload`), runners for specsure, transformers and llama.cpp (`runners`, `configs`,
`llamacpp`), the interleaved schedule (`harness`), one results structure (`results`) and what is
rendered from it: the markdown report (`report`) and the plots (`plots`); `generation` and `load`
are `specsure bench serve`'s requests and load generator. The commands are in `specsure.cli`.
"""
