# The measurement behind BENCHMARKS.md's "Memory" (its output: memory.txt). Nothing else running.
#   mkdir -p /tmp/old && git archive 04674c4 | tar -x -C /tmp/old    # the code before engines dropped the copies
set -x
cd /work/main
GGUF=$(.venv/bin/python -c "from specsure.models.gguf_cache import packaged_default_gguf; print(packaged_default_gguf())")
for i in 1 2; do
  PYTHONPATH=/tmp/old/src .venv/bin/python bench/serve_memory.py -- .venv/bin/python -m specsure serve --port {port}
  .venv/bin/python bench/serve_memory.py -- .venv/bin/python -m specsure serve --port {port}
  PYTHONPATH=/tmp/old/src .venv/bin/python bench/serve_memory.py -- .venv/bin/python -m specsure serve --port {port} \
      --speculative-config '{"method": "mtp"}'
  .venv/bin/python bench/serve_memory.py -- .venv/bin/python -m specsure serve --port {port} \
      --speculative-config '{"method": "mtp"}'
  .venv/bin/python bench/serve_memory.py -- .venv-llamacpp/llama-server/build/bin/llama-server -m "$GGUF" \
      --port {port} -t 2 -c 2048 -np 1 --no-webui
  .venv/bin/python bench/serve_memory.py -- .venv-llamacpp/llama-server/build/bin/llama-server -m "$GGUF" \
      --port {port} -t 2 -np 1 --no-webui
done
# 6 of Phi-3-mini's 32 layers as Q4_0 (random weights, the tests' 300-token vocabulary; no chat template, so a
# completion of token ids): .venv/bin/python bench/synthetic_gguf.py /tmp/phi/q4_0.gguf --family phi3 --layers 6 --quantize Q4_0
PYTHONPATH=/tmp/old/src .venv/bin/python bench/serve_memory.py --completions -- .venv/bin/python -m specsure serve \
    --model /tmp/phi/q4_0.gguf --port {port}
.venv/bin/python bench/serve_memory.py --completions -- .venv/bin/python -m specsure serve --model /tmp/phi/q4_0.gguf \
    --port {port}
.venv/bin/python bench/serve_memory.py --completions -- .venv-llamacpp/llama-server/build/bin/llama-server \
    -m /tmp/phi/q4_0.gguf --port {port} -t 2 -c 2048 -np 1 --no-webui
