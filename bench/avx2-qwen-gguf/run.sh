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
