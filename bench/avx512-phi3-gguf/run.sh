# The measurement behind BENCHMARKS.md's "Phi-3 GGUF files" (its output: decode.txt).
# The file first (half a minute; gguf-py quantises, no llama.cpp needed):
#   .venv/bin/python bench/synthetic_gguf.py /tmp/phi/q4_0.gguf --family phi3 --layers 6 --quantize Q4_0
#   mkdir -p /tmp/phi/old && git archive 79fbacf | tar -x -C /tmp/phi/old    # the code before Phi-3 ran natively
set -x
export XDG_CACHE_HOME=/tmp/phi/cache
cd /work/main
IDS=1,50,60,70,80,90,100,110
for i in 1 2 3; do
  PYTHONPATH=/tmp/phi/old/src .venv/bin/python bench/decode_time.py --model /tmp/phi/q4_0.gguf --prompt-ids $IDS
  .venv/bin/python bench/decode_time.py --model /tmp/phi/q4_0.gguf --prompt-ids $IDS
done
.venv/bin/python bench/decode_time.py --model /tmp/phi/q4_0.gguf --prompt-ids $IDS --int8-activations
for i in 1 2; do
  PYTHONPATH=/tmp/phi/old/src .venv/bin/python bench/decode_time.py
  .venv/bin/python bench/decode_time.py
done
