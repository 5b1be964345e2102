"""llama.cpp (llama-cpp-python) as a benchmark baseline, run in its own environment.

`convert` writes float GGUF copies of the target (the weights specsure runs, bit for bit),
`worker` is the standalone script that runs under llama-cpp-python's Python, `runner` talks
to it, and `baselines` builds the configurations or says why each cannot run.
"""
