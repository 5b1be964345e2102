# The measurement behind BENCHMARKS.md's "Qwen2 and Qwen3 GGUF files" (its output: decode.txt).
# The files first (about 3 minutes; needs `make llama-cpp` for llama.cpp's quantiser and
# `make llama-server` for the comparison):
#   .venv/bin/python bench/synthetic_gguf.py /tmp/q3/f32.gguf --family qwen3
#   .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/q3/f32.gguf /tmp/q3/Q4_K_M.gguf Q4_K_M
#   .venv/bin/python bench/synthetic_gguf.py /tmp/q3/q2-f32.gguf --family qwen2
#   .venv-llamacpp/bin/python bench/quantize_gguf.py /tmp/q3/q2-f32.gguf /tmp/q3/q2-Q4_K_M.gguf Q4_K_M
#   mkdir -p /tmp/q3/old && git archive bdeb846 | tar -x -C /tmp/q3/old    # the code before Qwen's blocks
set -x
export XDG_CACHE_HOME=/tmp/q3/cache
cd /work/main
IDS=1,50,60,70,80,90,100,110
for f in Q4_K_M q2-Q4_K_M; do
  .venv/bin/python bench/decode_ab.py --model /tmp/q3/$f.gguf --prompt-ids $IDS
  .venv/bin/python bench/decode_ab.py --model /tmp/q3/$f.gguf --prompt-ids $IDS --int8-activations
  for i in 1 2; do
    PYTHONPATH=/tmp/q3/old/src .venv/bin/python bench/decode_time.py --model /tmp/q3/$f.gguf --prompt-ids $IDS
    .venv/bin/python bench/decode_time.py --model /tmp/q3/$f.gguf --prompt-ids $IDS
  done
done
