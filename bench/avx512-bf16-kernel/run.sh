# The measurement behind BENCHMARKS.md's "The bf16 kernel for Qwen3, windows and partial rotaries" (output: decode.txt).
# The model first: a random Qwen3 with Qwen3-0.6B's layers (28 layers, hidden 1024, 16 heads of 128, 8 kv
# heads, MLP 3072, per-head q and k norms) as a Hugging Face folder, the tests' 300-token vocabulary:
#   .venv/bin/python bench/avx512-bf16-kernel/make_qwen3.py /tmp/phi/qwen3-folder
#   mkdir -p /tmp/phi/oldbf && git archive c56c05d | tar -x -C /tmp/phi/oldbf   # before the bf16 kernel ran them
set -x
cd /work/main
IDS=1,50,60,70,80,90,100,110
for i in 1 2 3; do
  PYTHONPATH=/tmp/phi/oldbf/src .venv/bin/python bench/decode_time.py --model /tmp/phi/qwen3-folder --dtype bfloat16 --prompt-ids $IDS
  .venv/bin/python bench/decode_time.py --model /tmp/phi/qwen3-folder --dtype bfloat16 --prompt-ids $IDS
done
for i in 1 2; do
  PYTHONPATH=/tmp/phi/oldbf/src .venv/bin/python bench/decode_time.py --dtype bfloat16
  .venv/bin/python bench/decode_time.py --dtype bfloat16
done
