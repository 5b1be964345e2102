# The measurement behind BENCHMARKS.md's "Gemma 3 GGUF files" (its output: decode.txt).
# The files first (about a minute; needs `make llama-cpp` for llama.cpp's quantiser and
# `make llama-server` for the comparison):
#   .venv/bin/python bench/synthetic_gguf.py /tmp/g3b/f32.gguf --family gemma3
#   .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/g3b/f32.gguf /tmp/g3b/Q4_K_M.gguf Q4_K_M
#   .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/g3b/f32.gguf /tmp/g3b/Q4_0.gguf Q4_0
#   mkdir -p /tmp/g3b/old && git archive 69c7c87 | tar -x -C /tmp/g3b/old    # the code before Gemma 3 ran natively
set -x
export XDG_CACHE_HOME=/tmp/g3b/cache
cd /work/main
IDS=1,50,60,70,80,90,100,110
for f in Q4_K_M Q4_0; do
  .venv/bin/python bench/decode_ab.py --model /tmp/g3b/$f.gguf --prompt-ids $IDS
  .venv/bin/python bench/decode_ab.py --model /tmp/g3b/$f.gguf --prompt-ids $IDS --int8-activations
  for i in 1 2; do
    PYTHONPATH=/tmp/g3b/old/src .venv/bin/python bench/decode_time.py --model /tmp/g3b/$f.gguf --prompt-ids $IDS
    .venv/bin/python bench/decode_time.py --model /tmp/g3b/$f.gguf --prompt-ids $IDS
  done
done
