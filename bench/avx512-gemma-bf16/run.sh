# The measurement behind BENCHMARKS.md's "Gemma in the bf16 kernel" (output: decode.txt).
# The model first: a random Gemma 3 with Gemma-3-270M's layers as a Hugging Face folder, the tests' vocabulary:
#   .venv/bin/python bench/avx512-gemma-bf16/make_gemma3.py /tmp/gem/gemma3-folder
#   mkdir -p /tmp/gem/old && git archive 94ed919 | tar -x -C /tmp/gem/old   # before the bf16 kernel ran Gemma
set -x
cd /work/main
IDS=1,50,60,70,80,90,100,110
for i in 1 2 3; do
  PYTHONPATH=/tmp/gem/old/src .venv/bin/python bench/decode_time.py --model /tmp/gem/gemma3-folder --dtype bfloat16 --prompt-ids $IDS
  .venv/bin/python bench/decode_time.py --model /tmp/gem/gemma3-folder --dtype bfloat16 --prompt-ids $IDS
done
for i in 1 2 3; do  # the default model in bf16: its one-token step now runs decode_rows' code
  PYTHONPATH=/tmp/gem/old/src .venv/bin/python bench/decode_time.py --dtype bfloat16
  .venv/bin/python bench/decode_time.py --dtype bfloat16
done
