/* float32 forwards of a Llama-family decoder over a few rows, in C, on AVX2 + FMA: decode and
 * verify steps in float32 (what dtype='auto' picks on CPUs without fast bf16, and for a GGUF target of
 * blocks on any CPU).
 *
 * Why: on an AVX2 CPU with 2 cores a 135M model's one-token step reads ~540 MB of float32 weights,
 * about 18 ms at the memory bandwidth, but torch's products over one to eight rows ran at a third
 * to a half of it (a one-row forward 47 ms, eight rows 74) and eager PyTorch adds ~600 small ops
 * on top. Here every weight is streamed once per forward, whatever the row count, and a whole run
 * of layers is one call (`decode_rows`).
 *
 * Products: each output y[i, j] is one 8-lane float32 FMA chain over k in order (16 lanes in the
 * AVX-512 build, `vec` below), then one fixed lane reduction, whatever the number of rows or how
 * they are blocked. A row's bits never depend
 * on how many rows run with it: a verify row equals the decode step at its position, so greedy
 * speculative decoding equals plain decoding bit for bit. Attention sums a row's scores and values
 * in an order fixed by the positions it sees (attend_queries), for the same reason.
 *
 * Numerics follow the transformers float32 forward step by step (RMSNorm, RoPE, softmax
 * attention, SiLU); results differ from torch's only in summation order and exp (a fixed
 * polynomial, below).
 *
 * Built by specsure.models.float_kernel (its FLAGS: AVX2, FMA, OpenMP; with -mavx512f where the CPU
 * has it), loaded after torch so its OpenMP calls run on torch's libgomp threads.
 */
#include <float.h>
#include <immintrin.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How a weight matrix [n, k] is stored: float32 rows, or GGUF's blocks of 32 weights along k,
 * repacked with float32 scales (gguf_blocks.py) so a block dequantises with one conversion: */
enum { F32 = 0, Q4_0 = 1, Q4_1 = 2, Q8_0 = 3, Q8_M = 4, Q8_H = 5, Q8_X = 6, A4 = 7, A8 = 8,
       R4_0 = 12, R4_1 = 13, R8_0 = 14, R8_M = 15, R8_H = 16, R8_X = 17, R5_0 = 18,
       R5_M = 19, R6_H = 20 };
/* Q4_0 {float d; uint8 qs[16]}: w = d (q - 8); Q4_1 {float d, m; uint8 qs[16]}: w = d q + m;
 * Q8_0 {float d; int8 qs[32]}: w = d q; Q8_M {float d, m; int8 qs[32]}: w = d q + m; Q8_H {float
 * d0, d1; int8 qs[32]}: w = d0 q for the first 16 weights, d1 q for the rest; Q8_X {float d0, d1,
 * m; int8 qs[32]}: w = d q + m with d as Q8_H's, any of the others widened (m = -0.0 where they have
 * none, which leaves d q, zeros' signs included), for a fused matrix whose parts differ. In Q4 blocks byte i
 * holds weight i in its low nibble and weight 16 + i in its high one, as in GGUF. gguf_blocks.py
 * maps GGUF's types onto these (Q5_0 and Q6_K's 6-bit quants onto the int8 ones, K-quants' scales
 * times their 6-bit sub-scales into d), always so that d q is exact in float32 and at most one
 * rounding follows, as in gguf-py: each weight dequantises to the float32 value gguf-py gives for
 * it, and every product below runs the same FMA chain over the same values as on float32 rows, so a
 * model whose float32 weights were dequantised from these blocks computes the same bits either way
 * (except where Q4 and Q8_0 matrices run on AMX tiles, A4 and A8 below: float32 sums in another order). */
static inline int64_t block_bytes(int64_t format) {
    return format == Q4_0 ? 20 : format == Q4_1 ? 24 : format == Q8_0 ? 36 : format == Q8_X ? 44 : 40;
}

typedef struct {
    const float *input_norm;
    const void *qkv;
    const float *qkv_bias;
    const void *o;
    const float *o_bias, *post_norm;
    const void *gate_up, *down;
    int64_t qkv_format, o_format, gate_up_format, down_format; /* F32 (0, what ctypes zero-fills) or a block format */
    const float *q_norm, *k_norm; /* Qwen3's RMSNorm of each q and k head before RoPE [head_dim]; NULL without */
    /* Gemma 3's: the norms of the attention's and the MLP's outputs before each joins the residual
     * stream (NULL without); this layer's own cos and sin [rows, rotary] where its RoPE differs from
     * the call's (a sliding layer's local base; NULL: the call's); the sliding window (0: none); and
     * the MLP's activation, 0 SiLU or 1 GELU's tanh form. */
    const float *attn_out_norm, *mlp_out_norm, *cos, *sin;
    int64_t window, gelu;
} Layer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    float scale; /* the attention scores' factor; 0 (what ctypes zero-fills): 1 / sqrt(head_dim) */
    float softcap; /* Gemma 2's: each score becomes softcap tanh(score / softcap); 0: none */
    int64_t rotary; /* the dims of each head that RoPE turns, its first ones (Phi-4-mini's 3/4); 0: head_dim */
} Shape;

/* One sequence's rows in one layer: `length` new tokens stored at `start ..` of this layer's cache
 * (keys and values [kv_heads, capacity, head_dim]). Row r attends to positions 0 .. start-1, then
 * to new token j when mask[r * length + j] (a token tree's ancestor matrix), or, with no mask,
 * when j <= r (a chain). */
typedef struct {
    float *keys, *values;
    int64_t capacity, start, length;
    const uint8_t *mask;
} Segment;

/* The mask for the last, partial chunk of a k-long dot product (all lanes when k % 8 == 0). */
static inline __m256i tail_mask(int64_t left) {
    const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - (left >= 8 ? 8 : left)));
}

/* The one lane reduction every output goes through: (0+4, 1+5, 2+6, 3+7), then pairs. */
static inline float reduce8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The products' vectors: 16 lanes where the build targets AVX-512 (float_kernel.py builds it on a
 * CPU with avx512f), 8 otherwise. The product code below is written once over `vec`; each output
 * is one LANES-lane FMA chain over k in order and one fixed reduction, the same on float32 rows
 * and on blocks, so within a build every equality above holds. The two builds sum in a different
 * order, so their bits differ from each other (as any two BLAS libraries'); a process loads one. */
#ifdef __AVX512F__
#define LANES 16
typedef __m512 vec;
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vbroadcast(p) _mm512_set1_ps(*(p))
/* The first `left` lanes of p (all 16 when left >= 16), the rest 0. */
static inline vec vload_first(const float *p, int64_t left) {
    return _mm512_maskz_loadu_ps(left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1), p);
}
/* (0+8, .., 7+15), then reduce8's order. */
static inline float vreduce(vec v) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return reduce8(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}
#else
#define LANES 8
typedef __m256 vec;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vbroadcast(p) _mm256_broadcast_ss(p)
static inline vec vload_first(const float *p, int64_t left) { return _mm256_maskload_ps(p, tail_mask(left)); }
static inline float vreduce(vec v) { return reduce8(v); }
#endif
#define CHUNKS (32 / LANES) /* vectors per block of 32 weights */

#define WROWS 4 /* weight rows per block: the block stays in L1 while the rows of x pass over it */
#define XROWS 3 /* rows of x per pass: 4 x 3 accumulators, 3 x values and a weight in 16 registers */

/* Outputs (i .. i + xr) x (wr weight rows from rows[w0]) of y = x . w^T, j0 the block's first
 * output; xr * wr accumulators. With `ahead`, the next block's weights are prefetched along the way. */
static inline __attribute__((always_inline)) void micro(const float *const *rows, int w0, int wr, const float *x,
                                                         float *y, int64_t n, int64_t k, int64_t i, int xr, int nr,
                                                         int64_t j0, const float *ahead) {
    vec acc[6][4];
    for (int a = 0; a < xr; a++)
        for (int r = 0; r < wr; r++) acc[a][r] = vzero();
    int64_t full = k - k % LANES;
    for (int64_t c = 0; c < full; c += LANES) {
        if (ahead && (c & 15) == 0)
            for (int64_t p = c * WROWS; p < (c + 16) * WROWS; p += 16)
                _mm_prefetch((const char *)(ahead + p), _MM_HINT_T0);
        vec xv[6];
        for (int a = 0; a < xr; a++) xv[a] = vload(x + (i + a) * k + c);
        for (int r = 0; r < wr; r++) {
            vec wv = vload(rows[w0 + r] + c);
            for (int a = 0; a < xr; a++) acc[a][r] = vfma(wv, xv[a], acc[a][r]);
        }
    }
    if (full < k) {
        for (int a = 0; a < xr; a++) {
            vec xv = vload_first(x + (i + a) * k + full, k - full);
            for (int r = 0; r < wr; r++) acc[a][r] = vfma(vload_first(rows[w0 + r] + full, k - full), xv, acc[a][r]);
        }
    }
    for (int a = 0; a < xr; a++)
        for (int r = 0; r < wr; r++)
            if (w0 + r < nr) y[(i + a) * n + j0 + w0 + r] = vreduce(acc[a][r]);
}

/* How many of the `left` rows of x the next pass takes: 3 at a time, a 4- or 5-row pass where 3s
 * would leave one or two rows. */
static inline int pass_rows(int64_t left) {
    return left == 4 || left == 5 ? (int)left : (left == 7 ? 4 : (left < 3 ? (int)left : 3));
}

/* One block of 4 weight rows over rows i .. i + xr of x: 4 x 3 accumulators for up to 3 rows, two
 * halves of 2 x xr for 4 or 5 (a 4-row pass as 3 + 1 was load-bound on its one-row part). */
static inline __attribute__((always_inline)) void pass(const float *const *rows, const float *x, float *y, int64_t n,
                                                        int64_t k, int64_t i, int xr, int nr, int64_t j0,
                                                        const float *ahead) {
    switch (xr) {
    case 1: micro(rows, 0, 4, x, y, n, k, i, 1, nr, j0, ahead); break;
    case 2: micro(rows, 0, 4, x, y, n, k, i, 2, nr, j0, ahead); break;
    case 3: micro(rows, 0, 4, x, y, n, k, i, 3, nr, j0, ahead); break;
    case 4:
        micro(rows, 0, 2, x, y, n, k, i, 4, nr, j0, ahead);
        micro(rows, 2, 2, x, y, n, k, i, 4, nr, j0, ahead);
        break;
    case 5:
        micro(rows, 0, 2, x, y, n, k, i, 5, nr, j0, ahead);
        micro(rows, 2, 2, x, y, n, k, i, 5, nr, j0, ahead);
        break;
    }
}

/* y [m, n] = x [m, k] . w [n, k]^T (+ bias), all row-major. OpenMP splits the weight rows; each
 * thread walks its blocks in memory order. Passes: 3 rows at a time, a 4- or 5-row pass where the
 * remainder would leave one or two rows. One row is a pure memory stream and prefetching only
 * costs it; past that the prefetch keeps the next block's reads going while this block computes
 * (the default model's products over 8 rows 36 -> 26 ms, 4 rows 29 -> 23, 3 rows 24 -> 22; one
 * row 19, its weights' read at the memory bandwidth 18). */
/* y [m, n] += bias for the output columns j0 .. j0 + nr, after every pass over them (the products'
 * last step, the same on float32 rows, on blocks and with int8 activations). */
static inline void add_bias(float *y, const float *bias, int64_t n, int64_t m, int64_t j0, int nr) {
    if (bias)
        for (int64_t a = 0; a < m; a++)
            for (int r = 0; r < nr; r++) y[a * n + j0 + r] += bias[j0 + r];
}

static void gemm(const float *w, const float *bias, const float *x, float *y, int64_t n, int64_t k, int64_t m) {
    int64_t blocks = (n + WROWS - 1) / WROWS;
    int prefetch = m > 1;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j0 = b * WROWS;
        int nr = n - j0 < WROWS ? (int)(n - j0) : WROWS;
        const float *rows[WROWS];
        for (int r = 0; r < WROWS; r++) rows[r] = w + (j0 + (r < nr ? r : 0)) * k;
        const float *next = prefetch && j0 + 2 * WROWS <= n ? w + (j0 + WROWS) * k : NULL;
        int64_t i = 0;
        while (i < m) {
            int64_t left = m - i;
            int xr = pass_rows(left);
            pass(rows, x, y, n, k, i, xr, nr, j0, next);
            i += xr;
        }
        add_bias(y, bias, n, m, j0, nr);
    }
}

/* Chunk e (weights LANES e .. LANES e + LANES - 1) of one block, dequantised. */
#ifdef __AVX512F__
static inline __attribute__((always_inline)) vec dequant(int format, const uint8_t *block, int e) {
    vec d = vbroadcast((const float *)block);
    if (format == Q8_0 || format == Q8_M || format == Q8_H || format == Q8_X) {
        const uint8_t *qs = block + (format == Q8_0 ? 4 : format == Q8_X ? 12 : 8) + 16 * e;
        vec q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
        if (format == Q8_0) return vmul(d, q);
        if (format == Q8_X) return vfma(e == 0 ? d : vbroadcast((const float *)block + 1), q, vbroadcast((const float *)block + 2));
        if (format == Q8_H) return vmul(e == 0 ? d : vbroadcast((const float *)block + 1), q);
        return vfma(d, q, vbroadcast((const float *)block + 1));
    }
    /* weights 0..15 are the 16 bytes' low nibbles, 16..31 their high ones */
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(block + (format == Q4_1 ? 8 : 4))));
    q = e == 0 ? _mm512_and_si512(q, _mm512_set1_epi32(15)) : _mm512_srli_epi32(q, 4);
    /* d (q - 8) as fma(d, q, -8 d): -8 d is exact, so both round the exact d (q - 8) once (the same
     * bits), and the FMA spares a subtraction */
    if (format == Q4_0) return vfma(d, _mm512_cvtepi32_ps(q), vmul(d, _mm512_set1_ps(-8.0f)));
    return vfma(d, _mm512_cvtepi32_ps(q), vbroadcast((const float *)block + 1)); /* see the AVX2 one */
}
#else
static inline __attribute__((always_inline)) vec dequant(int format, const uint8_t *block, int e) {
    __m256 d = _mm256_broadcast_ss((const float *)block);
    if (format == Q8_0 || format == Q8_M || format == Q8_H || format == Q8_X) {
        const uint8_t *qs = block + (format == Q8_0 ? 4 : format == Q8_X ? 12 : 8) + 8 * e;
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)qs)));
        if (format == Q8_0) return _mm256_mul_ps(d, q);
        if (format == Q8_X)
            return _mm256_fmadd_ps(e < 2 ? d : _mm256_broadcast_ss((const float *)block + 1), q,
                                   _mm256_broadcast_ss((const float *)block + 2));
        if (format == Q8_H) return _mm256_mul_ps(e < 2 ? d : _mm256_broadcast_ss((const float *)block + 1), q);
        return _mm256_fmadd_ps(d, q, _mm256_broadcast_ss((const float *)block + 1));
    }
    const uint8_t *qs = block + (format == Q4_1 ? 8 : 4) + 8 * (e & 1);
    __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
    q = e < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
    /* d (q - 8) as fma(d, q, -8 d): -8 d is exact, so both round the exact d (q - 8) once (the same
     * bits), and the FMA spares a subtraction */
    if (format == Q4_0) return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)));
    /* d q is exact, so the fused form rounds once, as gguf-py's (d * q) + m does */
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), _mm256_broadcast_ss((const float *)block + 1));
}
#endif

/* A decoder's matrices come flagged STREAMED in their format (`gguf_blocks.STREAMED`): its whole
 * weights pass once a step, more than the last-level cache holds, so their prefetches are
 * non-temporal and leave that cache to what is read again soon, a draft head's weights and the KV
 * cache. Beside the default model (96 MB a step) on a 2-core AMD EPYC with a 32 MB L3, the MTP head's
 * draft step fell 0.683 -> 0.643 ms and every method ran 0 to 2% faster (BENCHMARKS.md). A hint: no
 * result changes, so a race on `streamed` between two engines' threads could cost speed only. */
#define STREAMED 256
static int streamed, streaming = 1;
/* Whether STREAMED matrices are prefetched non-temporally (1, the default): a switch for measuring it
 * (bench/streamed_ab.py), which changes no result, only where the weights are cached. */
void float_streaming(int on) { streaming = on; }

/* Prefetch the `bytes` from `p` (whole lines): non-temporally for a STREAMED matrix. */
static inline __attribute__((always_inline)) void prefetch_lines(const uint8_t *p, int64_t bytes) {
    if (streamed)
        for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_NTA);
    else
        for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)(p + o), _MM_HINT_T0);
}

/* `micro` over block rows: the same chunks of LANES in the same order into the same accumulators. */
static inline __attribute__((always_inline)) void qmicro(int format, const uint8_t *const *rows, int w0, int wr,
                                                          const float *x, float *y, int64_t n, int64_t k, int64_t i,
                                                          int xr, int nr, int64_t j0, const uint8_t *ahead) {
    int64_t bytes = block_bytes(format), blocks = k / 32;
    vec acc[6][4];
    for (int a = 0; a < xr; a++)
        for (int r = 0; r < wr; r++) acc[a][r] = vzero();
    for (int64_t b = 0; b < blocks; b++) {
        if (ahead) prefetch_lines(ahead + b * bytes * WROWS, bytes * WROWS);
        for (int e = 0; e < CHUNKS; e++) {
            vec xv[6];
            for (int a = 0; a < xr; a++) xv[a] = vload(x + (i + a) * k + b * 32 + LANES * e);
            for (int r = 0; r < wr; r++) {
                vec wv = dequant(format, rows[w0 + r] + b * bytes, e);
                for (int a = 0; a < xr; a++) acc[a][r] = vfma(wv, xv[a], acc[a][r]);
            }
        }
    }
    for (int a = 0; a < xr; a++)
        for (int r = 0; r < wr; r++)
            if (w0 + r < nr) y[(i + a) * n + j0 + w0 + r] = vreduce(acc[a][r]);
}

/* One block of 4 weight rows over rows i .. i + xr of x, as two halves of 2 weight rows: 2 x xr
 * accumulators leave registers for the dequantising (with 4 x 3 they spilled; the halves made 1, 2
 * and 3 rows 10%, 45% and 70% faster on the AVX2 EPYC). */
static inline __attribute__((always_inline)) void qpass(int format, const uint8_t *const *rows, const float *x,
                                                         float *y, int64_t n, int64_t k, int64_t i, int xr, int nr,
                                                         int64_t j0, const uint8_t *ahead) {
    for (int w0 = 0; w0 < WROWS; w0 += 2) {
        switch (xr) {
        case 1: qmicro(format, rows, w0, 2, x, y, n, k, i, 1, nr, j0, ahead); break;
        case 2: qmicro(format, rows, w0, 2, x, y, n, k, i, 2, nr, j0, ahead); break;
        case 3: qmicro(format, rows, w0, 2, x, y, n, k, i, 3, nr, j0, ahead); break;
        case 4: qmicro(format, rows, w0, 2, x, y, n, k, i, 4, nr, j0, ahead); break;
        case 5: qmicro(format, rows, w0, 2, x, y, n, k, i, 5, nr, j0, ahead); break;
        }
    }
}

/* From this many rows of x a weight block is dequantised once into float32 rows, not once per pass
 * (the same values in the same order either way, so only the speed differs). 6 was measured best
 * for the AVX2 build on the AVX2 EPYC. With 16 lanes a block's dequantising costs half as much, and
 * on the AMX Xeon passes straight over the blocks beat the unpacked rows up to 12 rows and tied at
 * 16 (forwards of 6 rows 21 -> 17 ms, 8 rows 24.6 -> 19.6; BENCHMARKS.md, "AVX-512 products"). */
#ifdef __AVX512F__
#define UNPACK_ROWS 16
#else
#define UNPACK_ROWS 6
#endif

/* Every pass of x's rows over one block of weight rows; `format` a literal in each caller below, so
 * each format gets its own inlined loops. With many rows the block is dequantised into float32 rows
 * once and the float32 passes run over them: the same values in the same order, so the same bits. */
static inline __attribute__((always_inline)) void qrows(int format, const uint8_t *const *rows, const float *x,
                                                         float *y, int64_t n, int64_t k, int64_t m, int nr,
                                                         int64_t j0, const uint8_t *next, float *unpacked) {
    int64_t i = 0;
    if (unpacked) { /* m >= UNPACK_ROWS: room for WROWS x k floats, this thread's own */
        const float *frows[WROWS];
        int64_t bytes = block_bytes(format);
        for (int r = 0; r < WROWS; r++) {
            float *out = unpacked + r * k;
            for (int64_t b = 0; b < k / 32; b++)
                for (int e = 0; e < CHUNKS; e++) vstore(out + b * 32 + LANES * e, dequant(format, rows[r] + b * bytes, e));
            frows[r] = out;
        }
        while (i < m) {
            int64_t left = m - i;
            int xr = pass_rows(left);
            pass(frows, x, y, n, k, i, xr, nr, j0, NULL);
            i += xr;
        }
        return;
    }
    while (i < m) {
        int64_t left = m - i;
        int xr = pass_rows(left);
        qpass(format, rows, x, y, n, k, i, xr, nr, j0, next);
        i += xr;
    }
}

/* One function per format, each with its own inlined loops. */
#define QROWS(name, format)                                                                                      \
    static void name(const uint8_t *const *rows, const float *x, float *y, int64_t n, int64_t k, int64_t m, int nr, \
                     int64_t j0, const uint8_t *next, float *unpacked) {                                         \
        qrows(format, rows, x, y, n, k, m, nr, j0, next, unpacked);                                               \
    }
QROWS(qrows_q4_0, Q4_0)
QROWS(qrows_q4_1, Q4_1)
QROWS(qrows_q8_0, Q8_0)
QROWS(qrows_q8_m, Q8_M)
QROWS(qrows_q8_h, Q8_H)
QROWS(qrows_q8_x, Q8_X)

/* Rows `ids` of a block matrix [*, k] dequantised into out [count, k]: an input embedding looked up in a
 * tied LM head's blocks (`BlockEmbedding`). `dequant`'s bits are the float32 weights'; one call
 * instead of torch's ten ops took the default model's lookup 18 -> 6 us. */
void dequant_rows(const uint8_t *w, int64_t format, const int64_t *ids, int64_t count, int64_t k, float *out) {
    int64_t bytes = block_bytes(format), blocks = k / 32;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *row = w + ids[i] * blocks * bytes;
        for (int64_t b = 0; b < blocks; b++) {
            float *at = out + i * k + b * 32;
            for (int e = 0; e < CHUNKS; e++) vstore(at + LANES * e, dequant((int)format, row + b * bytes, e));
            /* Q4_0's d (q - 8) at q = 8 is a zero of d's sign; `dequant`'s FMA makes it +0, which no product
             * sees but an embedding row would keep */
            if (format == Q4_0)
                for (int j = 0; j < 32; j++)
                    if (at[j] == 0.0f) at[j] = copysignf(0.0f, *(const float *)(row + b * bytes));
        }
    }
}

/* `gemm` over a block matrix (k a multiple of 32), its weight rows split among the threads the same way. */
static void qgemm(int format, const uint8_t *w, const float *bias, const float *x, float *y, int64_t n, int64_t k,
                  int64_t m) {
    int64_t blocks = (n + WROWS - 1) / WROWS, row_bytes = k / 32 * block_bytes(format);
    void (*run)(const uint8_t *const *, const float *, float *, int64_t, int64_t, int64_t, int, int64_t,
                const uint8_t *, float *) = format == Q4_0 ? qrows_q4_0 : format == Q4_1 ? qrows_q4_1
                                           : format == Q8_0 ? qrows_q8_0 : format == Q8_M ? qrows_q8_m
                                           : format == Q8_H ? qrows_q8_h : qrows_q8_x;
#pragma omp parallel
    {
        /* each thread's buffer for a dequantised block (on the heap: 4 rows of a wide matrix would
         * not fit every thread stack) */
        float *unpacked = m >= UNPACK_ROWS ? malloc((size_t)(WROWS * k) * sizeof(float)) : NULL;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t j0 = b * WROWS;
            int nr = n - j0 < WROWS ? (int)(n - j0) : WROWS;
            const uint8_t *rows[WROWS];
            for (int r = 0; r < WROWS; r++) rows[r] = w + (j0 + (r < nr ? r : 0)) * row_bytes;
            /* unlike float32 rows, even one row's pass gains from the prefetch (Q8_0 2x, Q4_1 5%) */
            const uint8_t *next = j0 + 2 * WROWS <= n ? w + (j0 + WROWS) * row_bytes : NULL;
            run(rows, x, y, n, k, m, nr, j0, next, unpacked);
            add_bias(y, bias, n, m, j0, nr);
        }
        free(unpacked);
    }
}

/* Q4_0 and Q4_1 matrices on AMX tiles (A4), in the AMX build on a CPU whose Linux grants the tiles.
 *
 * Why: on the AMX Xeon a verify row cost about a fifth of a one-row step, the float32 multiply-adds
 * of one more row beside the dequantising they share, so learned heads barely paid. A tile
 * multiply costs the same for 1 row of x as for 16.
 *
 * How, and why it is still float32: per block of 32 weights, w = d q + m with q in 0..15, so
 * x . w = d (x . q) + m sum(x). Each float32 x is split into three bf16 parts, hi + mid + lo = x
 * exactly (each part holds the next 8 significant bits; the bf16 conversions flush denormals, so
 * below about 1e-33 a part is lost, an error far under float32's at any sum this size), and q is
 * exact in bf16, so every product the tile forms is exact and only the tile's float32 sums round.
 * An input of inf, or beyond bf16's largest (about 3.39e38), makes its row NaN. Per block the tile sums x . q
 * for each part of each row on its own (the parts are rows of the A operand); then, in a fixed
 * order for every row, s = (hi + mid) + lo, acc = fma(s, d, acc), acc = fma(m, sum(x), acc) over
 * the blocks in order.
 * The result differs from the FMA chains above by float32 roundings, like any two float32 BLAS.
 *
 * Why a verify row still equals the decode step: a tile's output row depends only on its own rows
 * of A (this x row's three parts) and on B, and everything after the tile is per row, so a row's
 * bits do not depend on the rows beside it, how many there are, or the thread that runs it. Every
 * forward through the kernel (every float32 forward, in pieces of 512 rows past that)
 * runs this path for a matrix packed as A4, whatever its row count.
 *
 * Layout (amx_pack): for each group of 16 weight rows, for each block of 32 along k, 384 bytes:
 * 256 of nibbles in the B operand's pair order, then the 16 rows' d, then their m (Q4_0: m = -8 d,
 * exact). B row p (0..15) holds weights 2p and 2p+1 of each of the 16 rows: value t = 2 row + e is
 * weight 2p + e of that row. Byte t of 32-byte chunk j holds B row 2j's value t in its low nibble
 * and B row 2j+1's in its high one, so widening 32 bytes to 16 bits and one lookup gives a B row.
 *
 * Q8_0 matrices (A8; on the default model its LM head, a sixth of a decode step, where each verify
 * row cost another fifth of it in multiply-adds): w = d q with q in -128..127, also exact in bf16,
 * so the same tiles and the same order of sums serve, with m = 0 left out. Per group of 16 rows and
 * block of 32, 576 bytes: B row p's 32 values as int8 (value t = 2 row + e is weight 2p + e of that
 * row), then the 16 rows' d. Widening a B row to bf16 goes through float32 (exact for integers). */
#define A4_GROUP 384
#define A8_GROUP 576
#define A4_FEW 5 /* up to this many rows of x, their 3 parts share one tile (15 of its 16 rows) */

/* Ask Linux for the tile registers (once per process; torch's oneDNN may have done so already).
 * use_amx = 0 keeps A4 off (SPECSURE_AMX=0); returns whether matrices may be packed as A4. */
int float_amx_init(int use_amx) {
#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
    return use_amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    (void)use_amx;
    return 0;
#endif
}

/* Repack a Q4_0 or Q4_1 matrix [n, k] (n % 16 == 0, k % 32 == 0) into A4, a Q8_0 one into A8; out:
 * n / 16 * k / 32 * A4_GROUP (A8_GROUP) bytes. */
void amx_pack(const uint8_t *w, int64_t format, int64_t n, int64_t k, uint8_t *out) {
    int64_t blocks = k / 32, bytes = block_bytes(format), quants = format == Q4_1 ? 8 : 4;
    if (format == Q8_0) {
        for (int64_t g = 0; g < n / 16; g++)
            for (int64_t b = 0; b < blocks; b++) {
                uint8_t *group = out + (g * blocks + b) * A8_GROUP;
                for (int r = 0; r < 16; r++) {
                    const uint8_t *block = w + ((g * 16 + r) * blocks + b) * bytes;
                    memcpy(group + 512 + 4 * r, block, 4);
                    for (int i = 0; i < 32; i++) group[32 * (i / 2) + 2 * r + i % 2] = block[4 + i];
                }
            }
        return;
    }
    for (int64_t g = 0; g < n / 16; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *group = out + (g * blocks + b) * A4_GROUP;
            float *d = (float *)(group + 256), *m = d + 16;
            memset(group, 0, 256);
            for (int r = 0; r < 16; r++) {
                const uint8_t *block = w + ((g * 16 + r) * blocks + b) * bytes;
                memcpy(&d[r], block, 4);
                if (format == Q4_1) memcpy(&m[r], block + 4, 4);
                else m[r] = -8.0f * d[r];
                for (int i = 0; i < 32; i++) {
                    int q = i < 16 ? block[quants + i] & 15 : block[quants + i - 16] >> 4;
                    int p = i / 2, t = 2 * r + i % 2;
                    group[32 * (p / 2) + t] |= (uint8_t)(p % 2 ? q << 4 : q);
                }
            }
        }
}

#if defined(__AMX_BF16__) && defined(__AVX512BF16__)
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* The top 16 bits of each float32 lane: bf16 back to float32, exactly. */
static inline __m512 widen_bf16(__m256bh h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

/* x [m, k] -> parts [3 m, k] bf16 (row 3 a + 0, 1, 2: the hi, mid and lo parts of x row a) and
 * sums [m, k / 32] (each block's 32 values added in one fixed order). */
static void split_rows(const float *x, uint16_t *parts, float *sums, int64_t m, int64_t k) {
    for (int64_t a = 0; a < m; a++) {
        for (int64_t c = 0; c < k; c += 16) {
            __m512 v = _mm512_loadu_ps(x + a * k + c);
            __m256bh hi = _mm512_cvtneps_pbh(v);
            __m512 rest = _mm512_sub_ps(v, widen_bf16(hi)); /* exact: v and hi agree in their top bits */
            __m256bh mid = _mm512_cvtneps_pbh(rest);
            __m256bh lo = _mm512_cvtneps_pbh(_mm512_sub_ps(rest, widen_bf16(mid)));
            _mm256_storeu_si256((__m256i *)(parts + (3 * a) * k + c), (__m256i)hi);
            _mm256_storeu_si256((__m256i *)(parts + (3 * a + 1) * k + c), (__m256i)mid);
            _mm256_storeu_si256((__m256i *)(parts + (3 * a + 2) * k + c), (__m256i)lo);
        }
        for (int64_t b = 0; b < k / 32; b++)
            sums[a * (k / 32) + b] = _mm512_reduce_add_ps(
                _mm512_add_ps(_mm512_loadu_ps(x + a * k + 32 * b), _mm512_loadu_ps(x + a * k + 32 * b + 16)));
    }
}

/* Tiles with `rows` rows of x (the A operand and the sums) and 16 of B. */
static void set_tiles(TileConfig *config, const int *rows_of, int count) {
    memset(config, 0, sizeof *config);
    config->palette = 1;
    for (int t = 0; t < count; t++) {
        config->rows[t] = (uint8_t)rows_of[t];
        config->colsb[t] = 64;
    }
    __asm__ volatile("" ::: "memory"); /* all 64 bytes written before ldtilecfg reads them */
    _tile_loadconfig(config);
}

/* One block's 16 weight rows in B's bf16 pair order, from its 256 bytes of nibbles. */
static inline void unpack_block(const uint8_t *nibbles, uint16_t *out) {
    /* q -> its bf16 bits (1.0 = 0x3f80, ...), twice: the lookup reads 5 index bits, and the low
     * nibble's lanes carry the high nibble's lowest bit above it. */
    const __m512i bf16_of = _mm512_set_epi16(
        0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000,
        0x3f80, 0, 0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40e0, 0x40c0, 0x40a0, 0x4080,
        0x4040, 0x4000, 0x3f80, 0);
    for (int j = 0; j < 8; j++) {
        __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(nibbles + 32 * j)));
        _mm512_store_si512(out + 2 * j * 32, _mm512_permutexvar_epi16(v, bf16_of));
        _mm512_store_si512(out + (2 * j + 1) * 32, _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), bf16_of));
    }
    /* The tile loads read these stores, but gcc 12's _tile_loadd does not say it reads memory: keep
     * the stores before them. */
    __asm__ volatile("" ::: "memory");
}

/* One A8 block's 16 weight rows in B's bf16 pair order, from its 512 bytes of int8 (already in that
 * order): q -> float32 -> its top 16 bits, exact for these integers. */
static inline void unpack_block8(const uint8_t *q, uint16_t *out) {
    for (int p = 0; p < 16; p++) {
        __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * p))));
        __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 32 * p + 16))));
        _mm512_store_si512(out + 32 * p, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    __asm__ volatile("" ::: "memory"); /* as in unpack_block */
}

/* A block of either packing into B's bf16 pair order. */
static inline __attribute__((always_inline)) void unpack_any(const uint8_t *group, int eight, uint16_t *out) {
    if (eight) unpack_block8(group, out);
    else unpack_block(group, out);
}

/* acc[a] += s d + m sum(x) for one block, s = (hi + mid) + lo from the tile's sums of row a's three
 * parts (at tile + part_step * part + row_step * a): the same order in both passes below. A8 has
 * no m (nor sums). */
static inline __attribute__((always_inline)) void scale_block(const uint8_t *group, int eight, const float *tile,
                                                              int64_t part_step, int64_t row_step, const float *sums,
                                                              int64_t stride, int rows, __m512 *acc) {
    const float *scales = (const float *)(group + (eight ? 512 : 256));
    __m512 d = _mm512_loadu_ps(scales), mins = eight ? d : _mm512_loadu_ps(scales + 16);
    for (int a = 0; a < rows; a++) {
        const float *t = tile + row_step * a;
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(t), _mm512_load_ps(t + part_step)),
                                 _mm512_load_ps(t + 2 * part_step));
        acc[a] = _mm512_fmadd_ps(s, d, acc[a]);
        if (!eight) acc[a] = _mm512_fmadd_ps(mins, _mm512_set1_ps(sums[a * stride]), acc[a]);
    }
}

/* Up to 5 rows of x (a decode step, a short verify), one group of 16 weight rows: one tile multiply
 * per block, its A the rows' 3 m parts, two blocks at a time (A in tiles 4-5, B in 6-7). The next
 * pair is unpacked while the tiles multiply this one, and a pair's sums (tiles 0-1, or 2-3 for every
 * other pair) are read only after the next pair's multiplies are issued: from 3 rows on, reading them
 * at once waited on the multiplies (bench/tile_rows.py, the default model's Q4 gate_up matrices at
 * 3, 4 and 5 rows: 59, 67 and 72 us, now 54, 53-56 and 61-66; 2 rows 49 either way; a whole forward
 * gains 2-3% at one row and nothing measurable at three). The blocks are still scaled in order: the
 * bits of reading each pair at once. */
#define FEW_ISSUE(c0, c1)                                                                                             \
    do {                                                                                                              \
        _tile_zero(c0);                                                                                               \
        _tile_loadd(4, parts + 32 * b, stride);                                                                       \
        _tile_loadd(6, now[0], 64);                                                                                   \
        _tile_dpbf16ps(c0, 4, 6);                                                                                     \
        if (pair) {                                                                                                   \
            _tile_zero(c1);                                                                                           \
            _tile_loadd(5, parts + 32 * b + 32, stride);                                                              \
            _tile_loadd(7, now[1], 64);                                                                               \
            _tile_dpbf16ps(c1, 5, 7);                                                                                 \
        }                                                                                                             \
    } while (0)
#define FEW_DRAIN(c0, c1, first, both)                                                                                \
    do {                                                                                                              \
        _tile_stored(c0, tile_sums[0], 64);                                                                           \
        scale_block(w + (first) * size, eight, tile_sums[0], 16, 48, sums + (first), blocks, rows, acc);              \
        if (both) {                                                                                                   \
            _tile_stored(c1, tile_sums[1], 64);                                                                       \
            scale_block(w + ((first) + 1) * size, eight, tile_sums[1], 16, 48, sums + (first) + 1, blocks, rows,     \
                        acc);                                                                                         \
        }                                                                                                             \
    } while (0)
static inline __attribute__((always_inline)) void few_rows(const uint8_t *w, int eight, const uint16_t *parts,
                                                           const float *sums, int64_t k, int rows,
                                                           uint16_t (*unpacked)[2][16 * 32],
                                                           float (*tile_sums)[16 * 16], __m512 *acc) {
    int64_t blocks = k / 32, stride = k * 2, size = eight ? A8_GROUP : A4_GROUP;
    unpack_any(w, eight, unpacked[0][0]);
    if (blocks > 1) unpack_any(w + size, eight, unpacked[0][1]);
    for (int64_t b = 0; b < blocks; b += 2) {
        const uint8_t *group = w + b * size;
        uint16_t(*now)[16 * 32] = unpacked[(b / 2) & 1], (*next)[16 * 32] = unpacked[(b / 2 + 1) & 1];
        /* A8's one-row pass keeps up with the FMA products only when fetched further ahead: on the AMX
         * Xeon its LM head 1.07-1.15 ms at 10 or 12 groups, 1.19 at 8, 1.22 at A4's 6, 1.47 without */
        for (int p = 0; p < 2 * size / 64; p++)
            _mm_prefetch((const char *)(group + (eight ? 10 : 6) * size + 64 * p), _MM_HINT_T0);
        int pair = b + 1 < blocks, odd = (b / 2) & 1;
        if (odd) FEW_ISSUE(2, 3);
        else FEW_ISSUE(0, 1);
        if (b + 2 < blocks) unpack_any(group + 2 * size, eight, next[0]);
        if (b + 3 < blocks) unpack_any(group + 3 * size, eight, next[1]);
        if (b >= 2) { /* the pair before this one: always two blocks */
            if (odd) FEW_DRAIN(0, 1, b - 2, 1);
            else FEW_DRAIN(2, 3, b - 2, 1);
        }
    }
    int64_t last = (blocks - 1) / 2 * 2; /* the last pair, one or two blocks */
    if ((last / 2) & 1) FEW_DRAIN(2, 3, last, last + 1 < blocks);
    else FEW_DRAIN(0, 1, last, last + 1 < blocks);
}
#undef FEW_ISSUE
#undef FEW_DRAIN

/* 6 to 16 rows of x, one group: per block three multiplies, one per part, each into its own sums
 * (tiles 0-2: hi, mid, lo sums; 3-5: their A; 6: B). A sum row depends only on its A row and B, so
 * it is the same number as `few_rows`' row for that part, and scale_block adds them alike. */
static inline __attribute__((always_inline)) void many_rows(const uint8_t *w, int eight, const uint16_t *parts,
                                                            const float *sums, int64_t k, int rows,
                                                            uint16_t (*unpacked)[16 * 32], float (*tile_sums)[16 * 16],
                                                            __m512 *acc) {
    int64_t blocks = k / 32, stride = 3 * k * 2, size = eight ? A8_GROUP : A4_GROUP;
    unpack_any(w, eight, unpacked[0]);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *group = w + b * size;
        for (int p = 0; p < size / 64; p++) _mm_prefetch((const char *)(group + 4 * size + 64 * p), _MM_HINT_T0);
        _tile_loadd(6, unpacked[b & 1], 64);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_loadd(3, parts + 32 * b, stride);
        _tile_loadd(4, parts + k + 32 * b, stride);
        _tile_loadd(5, parts + 2 * k + 32 * b, stride);
        _tile_dpbf16ps(0, 3, 6);
        _tile_dpbf16ps(1, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (b + 1 < blocks) unpack_any(group + size, eight, unpacked[(b + 1) & 1]); /* while the tiles multiply */
        _tile_stored(0, tile_sums[0], 64);
        _tile_stored(1, tile_sums[1], 64);
        _tile_stored(2, tile_sums[2], 64);
        scale_block(group, eight, tile_sums[0], 16 * 16, 16, sums + b, blocks, rows, acc);
    }
}

/* One group of 16 weight rows against `rows` rows of x from row a0, for either packing, into y
 * (plus bias). Inlined with `eight`, `few_pass` and (for the few-row pass) `rows` as constants:
 * with a runtime row count the accumulators lived on the stack, a store and a load on every
 * block's multiply-add chain (about a third of a verify row's cost in these passes). */
static inline __attribute__((always_inline)) void amx_group(const uint8_t *group, int eight, int few_pass,
                                                            const uint16_t *parts, const float *sums, int64_t k,
                                                            int64_t a0, int rows, uint16_t (*unpacked)[2][16 * 32],
                                                            float (*tile_sums)[16 * 16], const float *bias, float *y,
                                                            int64_t n) {
    int64_t blocks = k / 32;
    __m512 acc[16];
    for (int a = 0; a < rows; a++) acc[a] = _mm512_setzero_ps();
    if (few_pass) few_rows(group, eight, parts, sums, k, rows, unpacked, tile_sums, acc);
    else many_rows(group, eight, parts + 3 * a0 * k, sums + a0 * blocks, k, rows, unpacked[0], tile_sums, acc);
    for (int a = 0; a < rows; a++) {
        if (bias) acc[a] = _mm512_add_ps(acc[a], _mm512_loadu_ps(bias));
        _mm512_storeu_ps(y + (a0 + a) * n, acc[a]);
    }
}

/* `amx_group` for one packing, its row count made a constant where the pass is the few-row one. */
static inline __attribute__((always_inline)) void amx_rows(const uint8_t *group, int eight, int few_pass,
                                                           const uint16_t *parts, const float *sums, int64_t k,
                                                           int64_t a0, int rows, uint16_t (*unpacked)[2][16 * 32],
                                                           float (*tile_sums)[16 * 16], const float *bias, float *y,
                                                           int64_t n) {
#define AMX_ROWS(r) amx_group(group, eight, 1, parts, sums, k, a0, r, unpacked, tile_sums, bias, y, n)
    if (!few_pass) amx_group(group, eight, 0, parts, sums, k, a0, rows, unpacked, tile_sums, bias, y, n);
    else if (rows == 1) AMX_ROWS(1);
    else if (rows == 2) AMX_ROWS(2);
    else if (rows == 3) AMX_ROWS(3);
    else if (rows == 4) AMX_ROWS(4);
    else AMX_ROWS(5);
#undef AMX_ROWS
}

/* y [m, n] = x [m, k] . w^T (+ bias), w packed by amx_pack (A4 or A8: `format`). */
static void amx_gemm(const uint8_t *w, int64_t format, const float *bias, const float *x, float *y, int64_t n,
                     int64_t k, int64_t m) {
    int64_t blocks = k / 32, size = format == A8 ? A8_GROUP : A4_GROUP;
    uint16_t *parts = malloc((size_t)(3 * m * k) * sizeof(uint16_t));
    float *sums = malloc((size_t)(m * blocks) * sizeof(float));
    split_rows(x, parts, sums, m, k);
    int few_pass = m <= A4_FEW;
#pragma omp parallel
    {
        TileConfig config;
        int configured = 0; /* the row count the tiles are set for */
        __attribute__((aligned(64))) uint16_t unpacked[2][2][16 * 32];
        __attribute__((aligned(64))) float tile_sums[3][16 * 16];
#pragma omp for schedule(static)
        for (int64_t g = 0; g < n / 16; g++) {
            const uint8_t *group = w + g * blocks * size;
            for (int64_t a0 = 0; a0 < m; a0 += 16) { /* one pass for up to A4_FEW rows, else 16 at a time */
                int rows = m - a0 < 16 ? (int)(m - a0) : 16;
                if (rows != configured) {
                    int few[8] = {3 * rows, 3 * rows, 3 * rows, 3 * rows, 3 * rows, 3 * rows, 16, 16};
                    int many[7] = {rows, rows, rows, rows, rows, rows, 16};
                    if (few_pass) set_tiles(&config, few, 8);
                    else set_tiles(&config, many, 7);
                    configured = rows;
                }
                const float *b16 = bias ? bias + g * 16 : NULL;
                float *out = y + g * 16;
                if (format == A8)
                    amx_rows(group, 1, few_pass, parts, sums, k, a0, rows, unpacked, tile_sums, b16, out, n);
                else
                    amx_rows(group, 0, few_pass, parts, sums, k, a0, rows, unpacked, tile_sums, b16, out, n);
            }
        }
        if (configured) _tile_release();
    }
    free(parts);
    free(sums);
}
#else
static void amx_gemm(const uint8_t *w, int64_t format, const float *bias, const float *x, float *y, int64_t n,
                     int64_t k, int64_t m) {
    /* unreachable: float_amx_init returns 0 in a build without AMX, so nothing is packed as A4 or A8 */
    (void)w, (void)format, (void)bias, (void)x, (void)y, (void)n, (void)k, (void)m;
    abort();
}
#endif

/* Integer products, for a model loaded with int8 activations: each row of x is rounded, per block
 * of 32, to d x q with q = round(x / d) in -127..127 and d = max |x| / 127, and a weight block's
 * integers multiply x's in 8- and 16-bit lanes (maddubs, madd), exact in int32, as llama.cpp
 * multiplies them; one FMA scales a block's int32 sums by d_w d_x, and an offset m times x's block
 * sum d sum(q) joins its own chain. The weights are packed 8 rows side by side (below). The outputs
 * are llama.cpp's kind of approximation, not float32's bits. Every output is its own chains in a
 * fixed order over its own row of x, so a row's bits still do not depend on the rows beside it: a
 * verify row equals the decode step, and greedy speculation equals plain decoding in this mode too. */
typedef struct {
    float d, s; /* the block's scale, and d times the sum of its q */
    int8_t q[32];
    int32_t minus8_sum; /* -8 times the sum of q: R4_0's offset, added in int32 */
    int32_t halves[2];  /* the sums of the first 16 q and of the last 16: R6_H's offsets */
} XBlock;

/* x [m, k] -> m x k / 32 blocks; round half away from zero is not needed: ties round to even, the
 * same for every row layout. */
static void quantize_rows(const float *x, XBlock *out, int64_t m, int64_t k) {
    int64_t blocks = k / 32;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t a = 0; a < m; a++)
        for (int64_t b = 0; b < blocks; b++) {
            const float *p = x + a * k + b * 32;
            __m256 v[4], top = _mm256_setzero_ps(), finite = _mm256_setzero_ps();
            for (int c = 0; c < 4; c++) {
                v[c] = _mm256_loadu_ps(p + 8 * c);
                top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[c]));
                finite = _mm256_add_ps(finite, _mm256_sub_ps(v[c], v[c])); /* 0, or NaN for an inf or a NaN */
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            float amax = _mm_cvtss_f32(h), inverse = 127.0f / amax;
            /* a block below 127 / FLT_MAX (about 4e-37) counts as zeros: its inverse would be inf */
            __m256 scale = _mm256_set1_ps(amax > 0.0f && inverse <= FLT_MAX ? inverse : 0.0f);
            __m256i q[4];
            for (int c = 0; c < 4; c++)
                q[c] = _mm256_cvtps_epi32(
                    _mm256_round_ps(_mm256_mul_ps(v[c], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            /* the halves' sums, then the block's: wrapping vector adds, so a NaN's INT_MIN cannot overflow */
            __m256i first = _mm256_add_epi32(q[0], q[1]), second = _mm256_add_epi32(q[2], q[3]);
            __m128i halves = _mm_hadd_epi32(
                _mm_add_epi32(_mm256_castsi256_si128(first), _mm256_extracti128_si256(first, 1)),
                _mm_add_epi32(_mm256_castsi256_si128(second), _mm256_extracti128_si256(second, 1)));
            halves = _mm_hadd_epi32(halves, halves); /* first, second, first, second */
            __m128i s4 = _mm_hadd_epi32(halves, halves); /* the whole block's sum in every lane */
            /* the packs interleave 128-bit halves; the permute puts the 32 bytes back in order */
            __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            XBlock *o = out + a * blocks + b;
            o->d = amax / 127.0f;
            o->s = o->d * (float)_mm_cvtsi128_si32(s4);
            o->minus8_sum = (int32_t)(0u - 8u * (uint32_t)_mm_cvtsi128_si32(s4)); /* no overflow when a NaN made q INT_MIN */
            o->halves[0] = _mm_cvtsi128_si32(halves);
            o->halves[1] = _mm_extract_epi32(halves, 1);
            if (reduce8(finite) != 0.0f) /* MAXPS may drop a NaN: an inf or a NaN makes the block's outputs NaN, as float32's */
                o->d = o->s = NAN;
            packed = _mm256_permutevar8x32_epi32(packed, order);
            _mm256_storeu_si256((__m256i *)o->q, packed);
        }
}

/* R4_0 and R4_1: a Q4_0 or Q4_1 matrix repacked for the integer products, 8 weight rows side by
 * side, as llama.cpp repacks Q4_0 for AVX2 (a last group of fewer rows padded with zero rows, whose
 * lanes are never stored). Per group of 8 rows and block: 4 x 32 bytes of nibbles, where load j
 * holds bytes 4j .. 4j + 3 of each row's block in row order (so its low nibbles are weights
 * 4j .. 4j + 3 of the 8 rows, its high ones weights 16 + 4j ..), then the 8
 * rows' d, then (R4_1) their 8 m. One maddubs then multiplies 4 weights of all 8 rows by the same 4
 * values of x, broadcast; a block's 8 maddubs add up in int16 (at most 8 x 2 x 15 x 127 = 30480, no
 * saturation), one madd makes them the 8 rows' int32 block sums, and each row's output is one lane:
 * an FMA chain over the blocks, no reduction at the end. Q4_0's -8 enters the int32 sums as -8 times
 * x's block sum, exactly. About 2.5 instructions per row and block for each row of x after the
 * first, against 6 to 7 for blocks as they are (the path this replaced), and the unpacking is
 * shared by 8 rows.
 * R8_0, a Q8_0 matrix the same way: 8 x 32 bytes of int8 (load j: weights 4j .. 4j + 3 of the 8
 * rows), then the 8 d; maddubs takes |w| and x with w's sign, and each pair of products can reach
 * 2 x 128 x 127, so every load's sums go to int32 at once (madd) rather than adding in int16.
 * R8_M, R8_H and R8_X: Q8_M, Q8_H and Q8_X matrices (what Q5_1, Q5_K, Q6_K and fused q|k|v of mixed
 * formats are held as) packed as R8_0, each of their block's float32 scales 8 rows side by side
 * in the block's order (R8_M: d, m; R8_H: d0, d1; R8_X: d0, d1, m). Two scales (H, X) scale the
 * int32 sums of the first 16 weights (loads 0 to 3) and of the last 16 apart; an offset m joins
 * as R4_1's does. */
static inline int r_eight(int format) { return format == R8_0 || format == R8_M || format == R8_H || format == R8_X; }
static inline int r_halves(int format) { return format == R8_H || format == R8_X; }
static inline int r_offset(int format) { return format == R4_1 || format == R8_M || format == R8_X || format == R5_M; }
static inline int r_narrow(int format) { return format == R5_0 || format == R5_M || format == R6_H; }
static inline int64_t rblock_bytes(int format) {
    return format == R4_0 ? 160 : format == R4_1 || format == R5_0 ? 192 : format == R5_M ? 224 : format == R6_H ? 256
           : format == R8_0 ? 288 : format == R8_X ? 352 : 320;
}

/* The packing of a block format for the integer products (8-bit where its quants are int8). */
static inline int r_format(int64_t format) {
    return format == Q4_0 ? R4_0 : format == Q4_1 ? R4_1 : format == Q8_0 ? R8_0 : format == Q8_M ? R8_M
           : format == Q8_H ? R8_H : R8_X;
}

void int8_pack(const uint8_t *w, int64_t format, int64_t n, int64_t k, uint8_t *out) {
    int64_t blocks = k / 32, bytes = block_bytes(format);
    int header = format == Q4_0 || format == Q8_0 ? 1 : format == Q8_X ? 3 : 2;
    int64_t loads = r_eight(r_format(format)) ? 8 : 4, packed = rblock_bytes(r_format(format));
    for (int64_t g = 0; g < (n + 7) / 8; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * packed;
            uint8_t *scales = o + 32 * loads;
            memset(o, 0, (size_t)packed); /* a padding row: zero quants and scales */
            for (int r = 0; r < 8 && g * 8 + r < n; r++) {
                const uint8_t *block = w + ((g * 8 + r) * blocks + b) * bytes;
                for (int j = 0; j < loads; j++) memcpy(o + 32 * j + 4 * r, block + 4 * header + 4 * j, 4);
                for (int h = 0; h < header; h++) memcpy(scales + 32 * h + 4 * r, block + 4 * h, 4);
            }
        }
}

/* R5_0, R5_M and R6_H: Q8_0, Q8_M and Q8_H matrices whose quants fit in fewer bits (what Q5_0, Q5_1
 * and Q5_K, and Q6_K files are held as: q in -16 .. 15, 0 .. 31, -32 .. 31), for fewer bytes where
 * a decode step waits on memory. Per group of 8 rows and block: R4_0's 4 x 32 bytes of nibbles of
 * u = q + 16, q, q + 32; then a 32-byte plane of u's fifth bits (byte 4r + t, bit 2j: that of load
 * j's low nibble there; bit 2j + 1: its high nibble's), and R6_H a second one of their sixth bits;
 * then the scales as R8_0's, R8_M's and R8_H's. The integer sums, and so the outputs, are those of
 * the 8-bit packing to the bit (the offsets of u come back out exactly in int32). */
void int8_pack_narrow(const uint8_t *w, int64_t format, int64_t n, int64_t k, uint8_t *out) {
    int header = format == Q8_0 ? 1 : 2, six = format == Q8_H, offset = format == Q8_0 ? 16 : six ? 32 : 0;
    int64_t blocks = k / 32, bytes = block_bytes(format);
    int64_t packed = rblock_bytes(format == Q8_0 ? R5_0 : six ? R6_H : R5_M), scales = six ? 192 : 160;
    for (int64_t g = 0; g < (n + 7) / 8; g++)
        for (int64_t b = 0; b < blocks; b++) {
            uint8_t *o = out + (g * blocks + b) * packed;
            memset(o, 0, (size_t)packed); /* a padding row: zero quants and scales */
            for (int r = 0; r < 8 && g * 8 + r < n; r++) {
                const uint8_t *block = w + ((g * 8 + r) * blocks + b) * bytes;
                const int8_t *q = (const int8_t *)(block + 4 * header);
                for (int j = 0; j < 4; j++)
                    for (int t = 0; t < 4; t++) {
                        int at = 4 * r + t;
                        unsigned first = (unsigned)(q[4 * j + t] + offset), second = (unsigned)(q[16 + 4 * j + t] + offset);
                        o[32 * j + at] = (uint8_t)((first & 15) | (second & 15) << 4);
                        o[128 + at] |= (uint8_t)((first >> 4 & 1) << (2 * j) | (second >> 4 & 1) << (2 * j + 1));
                        if (six) o[160 + at] |= (uint8_t)((first >> 5 & 1) << (2 * j) | (second >> 5 & 1) << (2 * j + 1));
                    }
                for (int h = 0; h < header; h++) memcpy(o + scales + 32 * h + 4 * r, block + 4 * h, 4);
            }
        }
}

/* Bit `bit` of each byte of `plane` moved to bit `to` (4 or 5; 16-bit shifts by at most 5 left or 3
 * right: the bits they carry over from the neighbouring byte land below `to` or above it), the rest
 * cleared. */
static inline __attribute__((always_inline)) __m256i plane_bit(__m256i plane, int bit, int to) {
    __m256i at = bit < to ? _mm256_slli_epi16(plane, to - bit) : bit > to ? _mm256_srli_epi16(plane, bit - to) : plane;
    return _mm256_and_si256(at, _mm256_set1_epi8((char)(1 << to)));
}

/* 8 weight rows (one packed group) over rows i .. i + xr of x. */
static inline __attribute__((always_inline)) void rmicro(int format, const uint8_t *group, const XBlock *xq,
                                                          float *y, int64_t n, int64_t blocks, int64_t i, int xr,
                                                          int64_t j0, int nr, const float *bias, const uint8_t *ahead) {
    int64_t packed = rblock_bytes(format);
    __m256 acc[4], offsets[4];
    __m256i p16[4], last16[4]; /* last16: R6_H's int32 sums of the last 16 weights, scaled apart */
    for (int a = 0; a < xr; a++) acc[a] = offsets[a] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = group + b * packed;
        if (ahead) prefetch_lines(ahead + b * packed, packed); /* the next group's block: as the unpacked passes,
                                                                 even one row of x gains from it */
        for (int a = 0; a < xr; a++) p16[a] = last16[a] = _mm256_setzero_si256();
        if (r_eight(format)) { /* p16 holds int32 sums here */
            for (int j = 0; j < 8; j++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(block + 32 * j)), aw = _mm256_sign_epi8(w, w);
                for (int a = 0; a < xr; a++) {
                    int32_t four;
                    memcpy(&four, xq[(i + a) * blocks + b].q + 4 * j, 4);
                    __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(four), w);
                    p16[a] = _mm256_add_epi32(p16[a], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xs), ones));
                }
                if (j == 3 && r_halves(format)) { /* the first 16 weights' own scale d0 */
                    __m256 d0 = _mm256_loadu_ps((const float *)(block + 256));
                    for (int a = 0; a < xr; a++) {
                        __m256 scale = _mm256_mul_ps(d0, _mm256_broadcast_ss(&xq[(i + a) * blocks + b].d));
                        acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p16[a]), scale, acc[a]);
                        p16[a] = _mm256_setzero_si256();
                    }
                }
            }
        }
        if (r_narrow(format)) { /* p16 holds int32 sums here: two 5-bit maddubs reach 2 x 2 x 31 x 128 */
            __m256i fifth = _mm256_loadu_si256((const __m256i *)(block + 128));
            __m256i sixth = format == R6_H ? _mm256_loadu_si256((const __m256i *)(block + 160)) : fifth;
            __m256i pair[4], last_pair[4]; /* R6_H: the first of two loads' int16 sums */
            for (int j = 0; j < 4; j++) {
                __m256i bytes = _mm256_loadu_si256((const __m256i *)(block + 32 * j));
                __m256i lo = _mm256_or_si256(_mm256_and_si256(bytes, low), plane_bit(fifth, 2 * j, 4));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low),
                                             plane_bit(fifth, 2 * j + 1, 4));
                if (format == R6_H) {
                    lo = _mm256_or_si256(lo, plane_bit(sixth, 2 * j, 5));
                    hi = _mm256_or_si256(hi, plane_bit(sixth, 2 * j + 1, 5));
                }
                for (int a = 0; a < xr; a++) {
                    const int8_t *q = xq[(i + a) * blocks + b].q;
                    int32_t four[2];
                    memcpy(&four[0], q + 4 * j, 4);
                    memcpy(&four[1], q + 16 + 4 * j, 4);
                    __m256i first = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four[0]));
                    __m256i second = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four[1]));
                    if (format == R6_H) { /* the halves apart: low nibbles are weights 0 .. 15, high ones the rest; */
                        /* two loads' maddubs add up in int16 first (at most 2 x 2 x 63 x 128 = 32256) */
                        if (j % 2 == 0) {
                            pair[a] = first, last_pair[a] = second;
                        } else {
                            p16[a] = _mm256_add_epi32(p16[a], _mm256_madd_epi16(_mm256_add_epi16(pair[a], first), ones));
                            last16[a] = _mm256_add_epi32(last16[a],
                                                         _mm256_madd_epi16(_mm256_add_epi16(last_pair[a], second), ones));
                        }
                    } else {
                        p16[a] = _mm256_add_epi32(p16[a], _mm256_madd_epi16(_mm256_add_epi16(first, second), ones));
                    }
                }
            }
            if (format == R6_H) { /* the first 16 weights' own scale d0, as R8_H's at its fourth load */
                __m256 d0 = _mm256_loadu_ps((const float *)(block + 192));
                for (int a = 0; a < xr; a++) {
                    const XBlock *xb = xq + (i + a) * blocks + b;
                    __m256i sums = _mm256_add_epi32(p16[a], _mm256_set1_epi32((int32_t)(0u - 32u * (uint32_t)xb->halves[0])));
                    acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d0, _mm256_broadcast_ss(&xb->d)), acc[a]);
                    p16[a] = _mm256_add_epi32(last16[a], _mm256_set1_epi32((int32_t)(0u - 32u * (uint32_t)xb->halves[1])));
                }
            }
        }
        for (int j = 0; j < 4 * (format == R4_0 || format == R4_1); j++) {
            __m256i bytes = _mm256_loadu_si256((const __m256i *)(block + 32 * j));
            __m256i lo = _mm256_and_si256(bytes, low), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
            for (int a = 0; a < xr; a++) {
                const int8_t *q = xq[(i + a) * blocks + b].q;
                int32_t four[2]; /* memcpy: the compiler's broadcast load, without an aliasing cast */
                memcpy(&four[0], q + 4 * j, 4);
                memcpy(&four[1], q + 16 + 4 * j, 4);
                __m256i first = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(four[0]));
                __m256i second = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(four[1]));
                p16[a] = _mm256_add_epi16(p16[a], _mm256_add_epi16(first, second));
            }
        }
        /* the (last 16 weights') scale, and the offset m, after the quants */
        int64_t d_at = r_eight(format) ? 256 + 32 * r_halves(format) : format == R6_H ? 224 : r_narrow(format) ? 160 : 128;
        int64_t m_at = d_at + 32;
        __m256 d = _mm256_loadu_ps((const float *)(block + d_at));
        for (int a = 0; a < xr; a++) {
            const XBlock *xb = xq + (i + a) * blocks + b;
            __m256i sums = r_eight(format) || r_narrow(format) ? p16[a] : _mm256_madd_epi16(p16[a], ones);
            if (format == R4_0) sums = _mm256_add_epi32(sums, _mm256_set1_epi32(xb->minus8_sum));
            if (format == R5_0) /* -16 sum(q): unsigned, as minus8_sum, so a NaN block's INT_MIN cannot overflow */
                sums = _mm256_add_epi32(sums, _mm256_set1_epi32((int32_t)(2u * (uint32_t)xb->minus8_sum)));
            acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d, _mm256_broadcast_ss(&xb->d)), acc[a]);
            if (r_offset(format))
                offsets[a] = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(block + m_at)), _mm256_broadcast_ss(&xb->s),
                                             offsets[a]);
        }
    }
    float bias8[8] = {0}, out8[8]; /* a last group of nr < 8 rows: only its own lanes are read and written */
    __m256 b8 = _mm256_setzero_ps();
    if (bias && nr == 8) {
        b8 = _mm256_loadu_ps(bias + j0);
    } else if (bias) {
        memcpy(bias8, bias + j0, (size_t)nr * sizeof(float));
        b8 = _mm256_loadu_ps(bias8);
    }
    for (int a = 0; a < xr; a++) {
        __m256 out = _mm256_add_ps(acc[a], offsets[a]);
        if (bias) out = _mm256_add_ps(out, b8);
        if (nr == 8) {
            _mm256_storeu_ps(y + (i + a) * n + j0, out);
        } else {
            _mm256_storeu_ps(out8, out);
            memcpy(y + (i + a) * n + j0, out8, (size_t)nr * sizeof(float));
        }
    }
}

#define RROWS(name, format)                                                                                        \
    static void name(const uint8_t *group, const XBlock *xq, float *y, int64_t n, int64_t blocks, int64_t m,      \
                     int64_t j0, int nr, const float *bias, const uint8_t *ahead) {                                \
        for (int64_t i = 0; i < m; i += 3) {                                                                       \
            const uint8_t *next = i == 0 ? ahead : NULL;                                                           \
            switch (m - i >= 3 ? 3 : (int)(m - i)) {                                                               \
            case 1: rmicro(format, group, xq, y, n, blocks, i, 1, j0, nr, bias, next); break;                    \
            case 2: rmicro(format, group, xq, y, n, blocks, i, 2, j0, nr, bias, next); break;                    \
            default: rmicro(format, group, xq, y, n, blocks, i, 3, j0, nr, bias, next);                          \
            }                                                                                                      \
        }                                                                                                          \
    }
RROWS(rrows_r4_0, R4_0)
RROWS(rrows_r4_1, R4_1)
RROWS(rrows_r8_0, R8_0)
RROWS(rrows_r8_m, R8_M)
RROWS(rrows_r8_h, R8_H)
RROWS(rrows_r8_x, R8_X)
RROWS(rrows_r5_0, R5_0)
RROWS(rrows_r5_m, R5_M)
RROWS(rrows_r6_h, R6_H)

/* y [m, n] = x [m, k] . w^T (+ bias) over a packed matrix: each thread takes whole groups of 8 rows. */
static void rgemm(int64_t format, const uint8_t *w, const float *bias, const float *x, float *y, int64_t n, int64_t k,
                  int64_t m) {
    int64_t blocks = k / 32, group_bytes = blocks * rblock_bytes((int)format), groups = (n + 7) / 8;
    XBlock *xq = malloc((size_t)(m * blocks) * sizeof(XBlock));
    if (!xq) abort();
    quantize_rows(x, xq, m, k);
    void (*run)(const uint8_t *, const XBlock *, float *, int64_t, int64_t, int64_t, int64_t, int, const float *,
                const uint8_t *) =
        format == R4_0 ? rrows_r4_0 : format == R4_1 ? rrows_r4_1 : format == R8_0 ? rrows_r8_0
        : format == R8_M ? rrows_r8_m : format == R8_H ? rrows_r8_h : format == R8_X ? rrows_r8_x
        : format == R5_0 ? rrows_r5_0 : format == R5_M ? rrows_r5_m : rrows_r6_h;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; g++)
        run(w + g * group_bytes, xq, y, n, blocks, m, g * 8, n - g * 8 < 8 ? (int)(n - g * 8) : 8, bias,
            g + 1 < groups ? w + (g + 1) * group_bytes : NULL);
    free(xq);
}

/* y [m, n] = x [m, k] . w^T (+ bias) for w [n, k] in `format`. */
static void product(const void *w, int64_t format, const float *bias, const float *x, float *y, int64_t n, int64_t k,
                    int64_t m) {
    streamed = (format & STREAMED) != 0 && streaming; /* set here, outside the threads' region, read by all of them */
    format &= ~(int64_t)STREAMED;
    switch (format) {
    case Q4_0:
    case Q4_1:
    case Q8_0:
    case Q8_M:
    case Q8_H:
    case Q8_X: qgemm((int)format, w, bias, x, y, n, k, m); break;
    case A4:
    case A8: amx_gemm(w, format, bias, x, y, n, k, m); break;
    case R4_0:
    case R4_1:
    case R8_0:
    case R8_M:
    case R8_H:
    case R8_X:
    case R5_0:
    case R5_M:
    case R6_H: rgemm(format, w, bias, x, y, n, k, m); break;
    default: gemm(w, bias, x, y, n, k, m);
    }
}

/* `linear_rows` over a block matrix (the LM head of a GGUF model). */
void linear_blocks(const void *w, int64_t format, const float *bias, const float *x, float *y, int64_t n, int64_t k,
                   int64_t m) {
    product(w, format, bias, x, y, n, k, m);
}

/* The products for torch code (draft heads, the LM head): y [m, n] = x [m, k] . w [n, k]^T + bias. */
void linear_rows(const float *w, const float *bias, const float *x, float *y, int64_t n, int64_t k, int64_t m) {
    gemm(w, bias, x, y, n, k, m);
}

/* e^x for 8 lanes: x = n ln2 + r (Cody-Waite split), e^r by its degree-7 Taylor polynomial on
 * |r| <= ln2/2 (error below one float32 ulp), times 2^n built in the exponent bits. A fixed
 * formula, so every row rounds alike; libm's expf is scalar and several times slower. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* n is in [-126, 127] after the clamp: a normal power of two. */
    __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

/* x += delta (skipped when delta is NULL), then out = RMSNorm(x) * weight (skipped when weight is
 * NULL), for each row; LlamaRMSNorm's order: x * rsqrt(mean(x^2) + eps), then times the weight.
 * The sum of squares is 8 lanes of FMA chains and reduce8 (one scalar chain waited on each add's
 * latency: a few microseconds a norm, three norms a layer, on one thread while the other waits). */
void add_norm(float *x, const float *delta, const float *weight, float *out, int64_t rows, int64_t hidden,
              float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * hidden;
        if (delta)
            for (int64_t i = 0; i < hidden; i++) xr[i] += delta[r * hidden + i];
        if (!weight) continue;
        __m256 squares = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= hidden; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            squares = _mm256_fmadd_ps(v, v, squares);
        }
        float sum = reduce8(squares);
        for (; i < hidden; i++) sum += xr[i] * xr[i];
        float scale = 1.0f / sqrtf(sum / (float)hidden + eps);
        for (int64_t i = 0; i < hidden; i++) out[r * hidden + i] = weight[i] * (xr[i] * scale);
    }
}

/* act = SiLU(gate) * up per row (SiLU(g) = g / (1 + e^-g), as torch computes it); gate_up [rows, 2 inter]. */
void silu_mul(const float *gate_up, float *act, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * inter, *up = gate + inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            __m256 g = _mm256_loadu_ps(gate + i);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(act + r * inter + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
        }
        for (; i < inter; i++) act[r * inter + i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

/* act = GELU(gate) * up per row, GELU's tanh form (Gemma's): 0.5 g (1 + tanh(u)) with u = sqrt(2 / pi)
 * (g + 0.044715 g^3), computed as g / (1 + e^(-2u)), the same value (0.5 (1 + tanh u) is the logistic
 * of 2u) with SiLU's exponential, which cannot overflow into inf / inf. */
void gelu_mul(const float *gate_up, float *act, int64_t rows, int64_t inter) {
    const float c = 0.7978845608028654f, cube = 0.044715f;
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * inter, *up = gate + inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            __m256 g = _mm256_loadu_ps(gate + i);
            __m256 u = _mm256_mul_ps(_mm256_set1_ps(c), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(cube), g),
                                                                        _mm256_mul_ps(g, g), g));
            __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
            __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(act + r * inter + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
        }
        for (; i < inter; i++) {
            float g = gate[i], u = c * fmaf(cube * g, g * g, g);
            act[r * inter + i] = g / (1.0f + expf(-2.0f * u)) * up[i];
        }
    }
}

/* x * cos + rotate_half(x) * sin, in place. */
static void rope(float *x, const float *cos, const float *sin, int64_t dim) {
    int64_t half = dim / 2;
    float out[dim];
    for (int64_t i = 0; i < dim; i++) out[i] = x[i] * cos[i] + (i < half ? -x[i + half] : x[i - half]) * sin[i];
    memcpy(x, out, (size_t)dim * sizeof(float));
}

/* RoPE on q and k of every row (the first `rotary` dims of each head; cos/sin [rows, rotary]), then k
 * and v into each row's cache slot. qkv: [rows, qkv_size]. */
static void rope_and_store(const Shape *s, const Segment *segs, int64_t nseg, float *qkv, const float *cos,
                           const float *sin) {
    int64_t dim = s->head_dim, q_size = s->heads * dim, kv_size = s->kv_heads * dim;
    int64_t turned = s->rotary ? s->rotary : dim;
    int64_t row = 0;
    for (int64_t g = 0; g < nseg; g++) {
        const Segment *seg = &segs[g];
        for (int64_t r = 0; r < seg->length; r++, row++) {
            float *q = qkv + row * (q_size + 2 * kv_size), *k = q + q_size, *v = k + kv_size;
            const float *c = cos + row * turned, *sn = sin + row * turned;
            for (int64_t h = 0; h < s->heads; h++) rope(q + h * dim, c, sn, turned);
            for (int64_t h = 0; h < s->kv_heads; h++) {
                rope(k + h * dim, c, sn, turned);
                size_t bytes = (size_t)dim * sizeof(float);
                memcpy(seg->keys + (h * seg->capacity + seg->start + r) * dim, k + h * dim, bytes);
                memcpy(seg->values + (h * seg->capacity + seg->start + r) * dim, v + h * dim, bytes);
            }
        }
    }
}

#define MAX_DIM 512 /* head_dim limit: attention's output lanes below (float_kernel.py checks it) */
#define QUERIES 16 /* queries per attend_group call: their scores (16 x the context) bound its scratch */

/* LANES dot products' lanes summed at once: lane p of the result is the sum of d[p]'s lanes. Pairs
 * of vectors are interleaved and added, then pairs of pairs, then the 128-bit quarters: a fixed
 * order, and about three instructions a score where a reduction of its own costs eight. */
static inline vec transpose_sum(vec *d) {
#ifdef __AVX512F__
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) a[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]),
                                                     _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d lo = _mm512_castps_pd(a[2 * i]), hi = _mm512_castps_pd(a[2 * i + 1]);
        b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)), _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
    }
    for (int i = 0; i < 2; i++) c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                                     _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
#else
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) a[i] = _mm256_add_ps(_mm256_unpacklo_ps(d[2 * i], d[2 * i + 1]),
                                                     _mm256_unpackhi_ps(d[2 * i], d[2 * i + 1]));
    for (int i = 0; i < 2; i++) {
        __m256d lo = _mm256_castps_pd(a[2 * i]), hi = _mm256_castps_pd(a[2 * i + 1]);
        b[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(lo, hi)), _mm256_castpd_ps(_mm256_unpackhi_pd(lo, hi)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
#endif
}

/* One query of a kv head: its row's q for one head, where its output goes, and which positions it
 * sees: `first` .. `count` - 1, where position i < start is cache slot i and position start + j its
 * row's `extra[j]` (a chain's own and earlier rows, or a tree's ancestors). `first` is 0 but in a
 * sliding window. */
typedef struct {
    const float *q;
    float *out;
    const int64_t *extra;
    int64_t first, count;
} Query;

static inline int64_t slot_at(int64_t start, const int64_t *extra, int64_t i) {
    return i < start ? i : extra[i - start];
}

#define TILE 32 /* positions whose values (8 KB at head_dim 64) stay in L1 while a kv head's queries pass */

/* Attention for `n` queries that share one kv head's keys and values (a row's heads of that group,
 * and the group's heads of every other row). Each tile of positions is read from memory once and
 * then by every query from L1; before, each query streamed all its keys and values alone, which
 * made a verify row's attention as dear as the first row's.
 *
 * A query's arithmetic does not depend on the others, or on how many there are: its scores are
 * LANES positions at a time, LANES FMA chains side by side summed by transpose_sum (the last
 * count % LANES positions each one chain and vreduce); softmax by 8 lanes; the values in two FMA
 * chains, even and odd positions, in order. So a verify row's output has the bits the same
 * token's decode step would. Inlined with constant chunks for the usual head sizes, so the
 * compiler keeps every accumulator in a register (with a runtime count they lived on the stack:
 * a store and a load on every multiply-add's chain). */
static inline __attribute__((always_inline)) void attend_queries(const float *keys, const float *values,
                                                                int64_t start, const Query *qs, int64_t n,
                                                                const int64_t dim, const int64_t chunks,
                                                                const int64_t whole, float scale, float softcap,
                                                                float *scores,
                                                                int64_t score_stride, vec *state) {
    /* Indices below are relative to each query's first position (scores[j] is position first + j),
     * so a query's chunks and chains are the same whatever its neighbours' windows. */
    int64_t lanes = LANES, tail = dim - (chunks - 1) * lanes, most = 0;
    float totals[n];
    for (int64_t a = 0; a < n; a++) most = qs[a].count - qs[a].first > most ? qs[a].count - qs[a].first : most;
    for (int64_t i0 = 0; i0 + LANES <= most; i0 += LANES)
        for (int64_t a = 0; a < n; a++) {
            int64_t f = qs[a].first;
            if (f + i0 + LANES > qs[a].count) continue;
            const float *kt[LANES];
#pragma GCC unroll 16
            for (int p = 0; p < LANES; p++)  /* the cache's own order before `start`: no lookups */
                kt[p] = keys + (f + i0 + LANES <= start ? f + i0 + p : slot_at(start, qs[a].extra, f + i0 + p)) * dim;
            vec dot[LANES];
#pragma GCC unroll 16
            for (int p = 0; p < LANES; p++) dot[p] = vzero();
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) {
                vec qc = c < whole ? vload(qs[a].q + c * lanes) : vload_first(qs[a].q + c * lanes, tail);
#pragma GCC unroll 16
                for (int p = 0; p < LANES; p++)
                    dot[p] = vfma(qc, c < whole ? vload(kt[p] + c * lanes) : vload_first(kt[p] + c * lanes, tail), dot[p]);
            }
            vstore(scores + a * score_stride + i0, vmul(transpose_sum(dot), vbroadcast(&scale)));
        }
    for (int64_t a = 0; a < n; a++) {
        const float *q = qs[a].q;
        float *sc = scores + a * score_stride;
        int64_t f = qs[a].first, count = qs[a].count - f, i = count - count % LANES;
        for (; i < count; i++) {
            const float *kt = keys + slot_at(start, qs[a].extra, f + i) * dim;
            vec dot = vzero();
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++)
                dot = vfma(c < whole ? vload(q + c * lanes) : vload_first(q + c * lanes, tail),
                           c < whole ? vload(kt + c * lanes) : vload_first(kt + c * lanes, tail), dot);
            sc[i] = vreduce(dot) * scale;
        }
        if (softcap > 0.0f) { /* softcap tanh(s / softcap), tanh(y) as 1 - 2 / (1 + e^(2y)) */
            __m256 cap = _mm256_set1_ps(softcap), two = _mm256_set1_ps(2.0f), one = _mm256_set1_ps(1.0f);
            for (i = 0; i + 8 <= count; i += 8) {
                __m256 e = exp8(_mm256_mul_ps(two, _mm256_div_ps(_mm256_loadu_ps(sc + i), cap)));
                _mm256_storeu_ps(sc + i, _mm256_mul_ps(cap, _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(one, e)))));
            }
            for (; i < count; i++) sc[i] = softcap * (1.0f - 2.0f / (1.0f + expf(2.0f * (sc[i] / softcap))));
        }
        /* The maximum by 8 lanes (exact in any order), then the exponentials and their sum by 8
         * lanes, the lanes past `count` left out of the sum. */
        __m256 top8 = _mm256_set1_ps(-INFINITY);
        for (i = 0; i + 8 <= count; i += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(sc + i));
        float top = -INFINITY, lanes8[8];
        _mm256_storeu_ps(lanes8, top8);
        for (int l = 0; l < 8; l++)
            if (lanes8[l] > top) top = lanes8[l];
        for (; i < count; i++)
            if (sc[i] > top) top = sc[i];
        for (i = count; i < count + 8; i++) sc[i] = top; /* padding for the last vector below */
        __m256 sum8 = _mm256_setzero_ps();
        for (i = 0; i < count; i += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + i), _mm256_set1_ps(top)));
            _mm256_storeu_ps(sc + i, e);
            sum8 = _mm256_add_ps(sum8, _mm256_and_ps(e, _mm256_castsi256_ps(tail_mask(count - i))));
        }
        totals[a] = reduce8(sum8);
        for (int64_t c = 0; c < 2 * chunks; c++) state[a * 2 * chunks + c] = vzero();
    }
    /* The values by tiles of TILE (even) positions; each query's accumulators wait in `state`
     * between tiles: its even positions' chain, then its odd positions'. */
    for (int64_t i0 = 0; i0 < most; i0 += TILE)
        for (int64_t a = 0; a < n; a++) {
            int64_t f = qs[a].first, seen = qs[a].count - f;
            int64_t end = seen < i0 + TILE ? seen : i0 + TILE, i = i0;
            if (i0 >= end) continue;
            const float *sc = scores + a * score_stride;
            vec acc[chunks], odd[chunks];
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) {
                acc[c] = state[a * 2 * chunks + c];
                odd[c] = state[a * 2 * chunks + chunks + c];
            }
            for (; i + 2 <= end; i += 2) {
                const float *v0 = values + (f + end <= start ? f + i : slot_at(start, qs[a].extra, f + i)) * dim;
                const float *v1 = values + (f + end <= start ? f + i + 1 : slot_at(start, qs[a].extra, f + i + 1)) * dim;
                vec p0 = vbroadcast(sc + i), p1 = vbroadcast(sc + i + 1);
#pragma GCC unroll 16
                for (int64_t c = 0; c < chunks; c++) {
                    acc[c] = vfma(p0, c < whole ? vload(v0 + c * lanes) : vload_first(v0 + c * lanes, tail), acc[c]);
                    odd[c] = vfma(p1, c < whole ? vload(v1 + c * lanes) : vload_first(v1 + c * lanes, tail), odd[c]);
                }
            }
            if (i < end) { /* the last position of an odd count */
                const float *vt = values + slot_at(start, qs[a].extra, f + i) * dim;
                vec pv = vbroadcast(sc + i);
#pragma GCC unroll 16
                for (int64_t c = 0; c < chunks; c++)
                    acc[c] = vfma(pv, c < whole ? vload(vt + c * lanes) : vload_first(vt + c * lanes, tail), acc[c]);
            }
#pragma GCC unroll 16
            for (int64_t c = 0; c < chunks; c++) {
                state[a * 2 * chunks + c] = acc[c];
                state[a * 2 * chunks + chunks + c] = odd[c];
            }
        }
    for (int64_t a = 0; a < n; a++) {
        float out_lanes[MAX_DIM + 16];
        for (int64_t c = 0; c < chunks; c++)
            vstore(out_lanes + c * lanes, vadd(state[a * 2 * chunks + c], state[a * 2 * chunks + chunks + c]));
        for (int64_t d = 0; d < dim; d++) qs[a].out[d] = out_lanes[d] / totals[a];
    }
}

/* The queries qs[0 .. n) of kv head `kv` in one segment, with room for their scores and state. */
static void attend_group(const Shape *s, const Segment *seg, int64_t kv, const Query *qs, int64_t n) {
    int64_t dim = s->head_dim, chunks = (dim + LANES - 1) / LANES, whole = dim % LANES ? chunks - 1 : chunks;
    const float *keys = seg->keys + kv * seg->capacity * dim, *values = seg->values + kv * seg->capacity * dim;
    int64_t stride = seg->start + seg->length + LANES + 8;
    float *scores = malloc((size_t)(n * stride) * sizeof(float));
    vec *state = aligned_alloc(64, (size_t)(((n * 2 * chunks * (int64_t)sizeof(vec)) + 63) / 64 * 64));
    float scale = s->scale != 0.0f ? s->scale : 1.0f / sqrtf((float)dim);
    if (dim == 64)
        attend_queries(keys, values, seg->start, qs, n, 64, 64 / LANES, 64 / LANES, scale, s->softcap, scores, stride,
                       state);
    else if (dim == 128)
        attend_queries(keys, values, seg->start, qs, n, 128, 128 / LANES, 128 / LANES, scale, s->softcap, scores,
                       stride, state);
    else
        attend_queries(keys, values, seg->start, qs, n, dim, chunks, whole, scale, s->softcap, scores, stride, state);
    free(scores);
    free(state);
}

/* RoPE, the cache writes and attention for every row and head: out [rows, heads * head_dim].
 * The queries are ordered by segment, kv head, row and head, and each thread takes an equal run
 * of them, so the queries that share a kv head's cache are mostly on one thread, together. */
static void attend_all(const Shape *s, const Segment *segs, int64_t nseg, int64_t rows, float *qkv,
                       const float *cos, const float *sin, int64_t window, float *out) {
    rope_and_store(s, segs, nseg, qkv, cos, sin);
    int64_t dim = s->head_dim, heads = s->heads, group = heads / s->kv_heads;
    int64_t stride = (heads + 2 * s->kv_heads) * dim, most = 0;
    for (int64_t g = 0; g < nseg; g++) most = segs[g].length > most ? segs[g].length : most;
    /* each row's new tokens that it sees, as cache slots */
    int64_t *extra = malloc((size_t)(rows * (most + 1)) * sizeof(int64_t)), counts[rows];
    Query *all = malloc((size_t)(rows * heads) * sizeof(Query));
    int64_t firsts[nseg], seen_from[rows]; /* each segment's first query; each row's first position */
    for (int64_t g = 0, first_row = 0; g < nseg; first_row += segs[g++].length) {
        const Segment *seg = &segs[g];
        firsts[g] = first_row * heads;
        for (int64_t r = 0; r < seg->length; r++) {
            int64_t row = first_row + r, n = 0;
            for (int64_t j = 0; j < seg->length; j++)
                if (seg->mask ? seg->mask[r * seg->length + j] : j <= r) extra[row * (most + 1) + n++] = seg->start + j;
            counts[row] = seg->start + n;
            /* the row sits at position start + n - 1 (a tree node at its depth) and, in a window,
             * sees the keys above position start + n - 1 - window */
            seen_from[row] = window > 0 && seg->start + n - window > 0 ? seg->start + n - window : 0;
        }
        for (int64_t kv = 0, i = firsts[g]; kv < s->kv_heads; kv++)
            for (int64_t r = 0; r < seg->length; r++)
                for (int64_t k = 0; k < group; k++, i++) {
                    int64_t row = first_row + r, h = kv * group + k;
                    all[i] = (Query){qkv + row * stride + h * dim, out + row * heads * dim + h * dim,
                                     extra + row * (most + 1), seen_from[row], counts[row]};
                }
    }
#pragma omp parallel
    {
        int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t lo = rows * heads * t / threads, hi = rows * heads * (t + 1) / threads;
        for (int64_t g = 0; g < nseg; g++) {
            int64_t per_kv = segs[g].length * group;
            for (int64_t kv = 0; kv < s->kv_heads; kv++) {
                int64_t a = firsts[g] + kv * per_kv, b = a + per_kv;
                a = a > lo ? a : lo;
                b = b < hi ? b : hi;
                for (; a < b; a += QUERIES) attend_group(s, &segs[g], kv, all + a, b - a < QUERIES ? b - a : QUERIES);
            }
        }
    }
    free(extra);
    free(all);
}

/* The rows path of a draft head's layer, between its products: RoPE, the cache writes and
 * attention. segs: the layer's segments (their rows in order); qkv [rows, qkv_size] (RoPE applied in
 * place); out [rows, heads head_dim]. */
void attend_rows(const Shape *s, const Segment *segs, int64_t nseg, float *qkv, const float *cos, const float *sin,
                 float *out) {
    int64_t rows = 0;
    for (int64_t g = 0; g < nseg; g++) rows += segs[g].length;
    attend_all(s, segs, nseg, rows, qkv, cos, sin, 0, out);
}

/* `count` layers over `rows` rows in one call (a decode step, a verify step, a batch of sequences),
 * each layer's segments at segs[l * nseg ..] (their rows in order; the caller has made room in
 * the caches). cos/sin: [rows, rotary]. x: [rows, hidden], the residual stream, updated in
 * place; scratch: room for rows x (2 hidden + qkv_size + heads head_dim + 3 intermediate) floats. */
void decode_rows(const Shape *s, const Layer *layers, int64_t count, const Segment *segs, int64_t nseg,
                  int64_t rows, const float *cos, const float *sin, float *x, float *scratch) {
    int64_t hidden = s->hidden, dim = s->head_dim, inter = s->intermediate;
    int64_t q_size = s->heads * dim, kv_size = s->kv_heads * dim, qkv_size = q_size + 2 * kv_size;
    float *h = scratch, *delta = h + rows * hidden, *qkv = delta + rows * hidden, *att = qkv + rows * qkv_size;
    float *gate_up = att + rows * q_size, *act = gate_up + rows * 2 * inter;
    for (int64_t l = 0; l < count; l++) {
        const Layer *layer = &layers[l];
        add_norm(x, NULL, layer->input_norm, h, rows, hidden, s->eps);
        product(layer->qkv, layer->qkv_format, layer->qkv_bias, h, qkv, qkv_size, hidden, rows);
        if (layer->q_norm) /* each head a row of head_dim, normed in place */
            for (int64_t r = 0; r < rows; r++) {
                float *q = qkv + r * qkv_size;
                add_norm(q, NULL, layer->q_norm, q, s->heads, dim, s->eps);
                add_norm(q + q_size, NULL, layer->k_norm, q + q_size, s->kv_heads, dim, s->eps);
            }
        attend_all(s, segs + l * nseg, nseg, rows, qkv, layer->cos ? layer->cos : cos, layer->sin ? layer->sin : sin,
                   layer->window, att);
        product(layer->o, layer->o_format, layer->o_bias, att, delta, hidden, q_size, rows);
        if (layer->attn_out_norm) add_norm(delta, NULL, layer->attn_out_norm, delta, rows, hidden, s->eps);
        add_norm(x, delta, layer->post_norm, h, rows, hidden, s->eps);
        product(layer->gate_up, layer->gate_up_format, NULL, h, gate_up, 2 * inter, hidden, rows);
        (layer->gelu ? gelu_mul : silu_mul)(gate_up, act, rows, inter);
        product(layer->down, layer->down_format, NULL, act, delta, hidden, inter, rows);
        if (layer->mlp_out_norm) add_norm(delta, NULL, layer->mlp_out_norm, delta, rows, hidden, s->eps);
        add_norm(x, delta, NULL, NULL, rows, hidden, s->eps);
    }
}
