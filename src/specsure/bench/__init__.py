"""Spec-Bench-style benchmarking of specsure's methods against Hugging Face transformers.

Workloads (`workload`), runners for both libraries (`runners`, `configs`), the interleaved
schedule (`harness`), one results structure (`results`) and what is rendered from it: the
markdown report (`report`) and the plots (`plots`). `cli` is `specsure bench`.
"""
