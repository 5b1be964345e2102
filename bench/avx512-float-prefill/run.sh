# The measurement behind BENCHMARKS.md's "Every float32 forward in C" (output: prefill.txt).
#   mkdir -p /tmp/gem/old && git archive 94ed919 | tar -x -C /tmp/gem/old   # long float32 prefills on torch
set -x
cd /work/main
for n in 200 1000 4000; do
  for i in 1 2; do
    PYTHONPATH=/tmp/gem/old/src .venv/bin/python bench/prefill_time.py --tokens $n
    .venv/bin/python bench/prefill_time.py --tokens $n
  done
done
for i in 1 2 3; do  # decoding, which the change does not touch
  PYTHONPATH=/tmp/gem/old/src .venv/bin/python bench/decode_time.py
  .venv/bin/python bench/decode_time.py
done
