/* bfloat16 forwards of a Llama-family decoder (Gemma's included) over a few rows, in C: decode and
 * verify steps.
 *
 * Why: on a 2-core CPU a 135M model's one-token step reads ~270 MB of weights (about 16 ms at
 * the memory bandwidth), but eager PyTorch adds ~600 small ops per step on top. Here a one-token
 * step is one call for all layers (`decode_layers`), and so is a forward over a few rows (a verify
 * step, a batch of sequences: `decode_rows`). (`add_norm`, `add_gemma_norm`, `attend_rows` and
 * `silu_mul` are also exported, for the draft heads' layers and the final norm.) OpenMP
 * splits the products and attention over torch's own libgomp threads (the library is loaded after
 * torch), so there is no second thread pool.
 *
 * Products: AMX tiles where Linux grants them (`kernel_init`), else AVX512-BF16 dot-product tiles;
 * both read each weight once for all the rows.
 * Which one runs depends on the weight's shape only, and every output is one fixed-order sum, so a
 * row's bits never depend on how many rows run with it: a verify row equals the decode step at its
 * position. Attention walks a row's visible positions in position order for the same reason.
 *
 * Numerics follow the transformers bf16 forward step by step: every tensor the model would hold
 * in bf16 is rounded to bf16 here at the same point (norms, products, RoPE terms, attention
 * output, SiLU or GELU, residual adds); products and attention accumulate in float32. Results differ
 * from torch's only in float32 summation order (and exp: a fixed polynomial, below), and for Gemma
 * 2's soft-capped scores, which its eager attention rounds to bf16 and this kernel keeps in float32.
 *
 * Built by specsure.models.kernel (its FLAGS: AVX512-F/BW/VL/BF16, AMX-TILE/BF16, OpenMP).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef uint16_t bf16;

/* The norm weights (input_norm, post_norm, q_norm, k_norm) are bf16, or with `gemma` float32 factors
 * 1 + w (fused_layer.gemma_norm), as Gemma's RMSNorm multiplies in float32. */
typedef struct {
    const void *input_norm;
    const bf16 *qkv, *qkv_bias, *o, *o_bias;
    const void *post_norm;
    const bf16 *gate_up, *down;
    bf16 *keys, *values; /* [kv_heads, capacity, head_dim]: this layer's KV cache buffers */
    int64_t capacity;
    const void *q_norm, *k_norm; /* Qwen3's and Gemma 3's RMSNorm of each q and k head before RoPE [head_dim]; NULL without */
    int64_t window; /* a sliding window (Mistral's, Phi-3's, Gemma's): a row sees its last `window` positions; 0: all */
    /* Gemma's: the norms of the attention's and the MLP's outputs before each joins the residual
     * stream (float32 factors; NULL without); this layer's own cos and sin [rows, rotary] where its
     * RoPE differs from the call's (Gemma 3's sliding layers; NULL: the call's); and `gemma`: Gemma's
     * norms (above) and a GELU-gated MLP (GELU's tanh form) instead of a SiLU-gated one. */
    const float *attn_out_norm, *mlp_out_norm;
    const bf16 *cos, *sin;
    int64_t gemma;
} Layer;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    float scale;   /* the attention scores' factor (Gemma's); 0: 1 / sqrt(head_dim) */
    float softcap; /* Gemma 2's: each score becomes softcap tanh(score / softcap); 0: none */
    int64_t rotary; /* the dims of each head that RoPE turns, its first ones (Phi-4-mini's 3/4); 0: head_dim */
} Shape;

/* One sequence's rows in a forward: `length` new tokens stored at `start ..` of this layer's cache.
 * Row r attends to positions 0 .. start-1, then to new token j when mask[r * length + j] (a
 * token tree's ancestor matrix), or, with no mask, when j <= r (a chain). */
typedef struct {
    bf16 *keys, *values;
    int64_t capacity, start, length;
    const uint8_t *mask;
} Segment;

static inline float f32(bf16 v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16, round to nearest even (torch's conversion); NaN stays NaN. */
static inline bf16 round_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

static inline __m512bh load_bf16(const bf16 *p, int64_t left) {
    __mmask32 mask = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1u);
    return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

#define ROWS 4  /* weight rows per block: their sums run as independent chains */
#define XROWS 6 /* rows of x per register tile: ROWS * XROWS = 24 of the 32 zmm registers hold sums */
#define AHEAD 2 /* blocks ahead whose weights are prefetched while a block computes */

/* The sums of the ROWS weight rows `wr` against xr rows of x (xr <= XROWS; a constant wherever this
 * is inlined, so the sums stay in registers). Each sum runs over k in order in 16 float32 lanes,
 * then one fixed lane reduction: its bits depend on its weight row and its row of x only. With
 * `ahead`, the lines of the block AHEAD blocks on are prefetched, one per weight row per step:
 * without it the four interleaved row streams ran at 12-18 GB/s on a Zen 4 core pair that streams
 * 50 GB/s, with it at 33 GB/s (a C harness over 276 MB of weights). */
static inline __attribute__((always_inline)) void dot_tile(const bf16 *const *wr, const bf16 *x, int64_t k, int xr,
                                                           const bf16 *ahead, float out[ROWS][XROWS]) {
    __m512 acc[ROWS][XROWS];
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < xr; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        if (ahead)
            for (int r = 0; r < ROWS; r++) _mm_prefetch((const char *)(ahead + r * k + c), _MM_HINT_T0);
        __m512bh wv[ROWS];
        for (int r = 0; r < ROWS; r++) wv[r] = load_bf16(wr[r] + c, k - c);
        for (int i = 0; i < xr; i++) {
            __m512bh xv = load_bf16(x + i * k + c, k - c);
            for (int r = 0; r < ROWS; r++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv[r], xv);
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < xr; i++) out[r][i] = _mm512_reduce_add_ps(acc[r][i]);
}

/* y[i, j] = round(w[j, :] . x[i, :]) for the m rows of x and weight rows j in first .. first +
 * count; w is [n, k] row-major. A block of ROWS weight rows stays in L1 while register tiles of up
 * to XROWS rows of x pass over it, so the weights are read from memory once whatever m is: 1 to 9
 * rows cost about the same (8-9 ms for 276 MB in the harness; oneDNN 14-16 ms), 64 rows 34 ms
 * (oneDNN 30). Every output is `dot_tile`'s fixed-order sum: row-invariant. */
static void gemm_dot(const bf16 *w, const bf16 *x, bf16 *y, int64_t n, int64_t k, int64_t m, int64_t count,
                     int64_t first) {
    int64_t blocks = (count + ROWS - 1) / ROWS;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j0 = first + b * ROWS;
        int nr = first + count - j0 < ROWS ? (int)(first + count - j0) : ROWS;
        const bf16 *rows[ROWS];
        for (int r = 0; r < ROWS; r++) rows[r] = w + (j0 + (r < nr ? r : 0)) * k;
        /* Only whole blocks are prefetched, and only by the first tile (the others find them in L1). */
        const bf16 *ahead = (b + AHEAD + 1) * ROWS <= count ? w + (j0 + AHEAD * ROWS) * k : NULL;
        for (int64_t i0 = 0; i0 < m; i0 += XROWS) {
            const bf16 *xi = x + i0 * k, *pre = i0 == 0 ? ahead : NULL;
            int xr = m - i0 < XROWS ? (int)(m - i0) : XROWS;
            float out[ROWS][XROWS];
            switch (xr) { /* a constant per case, so each case compiles to its own register tile */
            case 1: dot_tile(rows, xi, k, 1, pre, out); break;
            case 2: dot_tile(rows, xi, k, 2, pre, out); break;
            case 3: dot_tile(rows, xi, k, 3, pre, out); break;
            case 4: dot_tile(rows, xi, k, 4, pre, out); break;
            case 5: dot_tile(rows, xi, k, 5, pre, out); break;
            default: dot_tile(rows, xi, k, XROWS, pre, out); break;
            }
            for (int r = 0; r < nr; r++)
                for (int i = 0; i < xr; i++) y[(i0 + i) * n + j0 + r] = round_bf16(out[r][i]);
        }
    }
}

/* AMX: Linux hands out the tile registers on request, once per process. */
static int amx_ready = 0;

/* use_amx = 0 keeps the products on the dot-product loop (SPECSURE_KERNEL=dot, and the tests). */
int kernel_init(int use_amx) {
    amx_ready = use_amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return amx_ready;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* The same product on AMX tiles, for the first n - n % 16 weight rows (k % 32 == 0): the weights
 * are the A operand (16 rows x 32 values, read in place), the rows of x the B operand, packed in
 * pairs and zero-padded to 16 columns. Each output depends only on its weight row and its row of
 * x, so results are row-invariant too; they matched oneDNN's AMX matmul (torch's F.linear) on
 * every element compared, every weight shape of the default model at 1, 9 and 17 rows. */
static void gemm_amx(const bf16 *w, const bf16 *x, bf16 *y, int64_t n, int64_t k, int64_t m) {
    int64_t mblocks = (m + 15) / 16, pairs = k / 2;
    size_t bytes = (size_t)(mblocks * pairs * 16) * sizeof(uint32_t);
    uint32_t *packed = aligned_alloc(64, bytes);
    memset(packed, 0, bytes);
    const uint32_t *x32 = (const uint32_t *)x;
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < pairs; p++) packed[((i / 16) * pairs + p) * 16 + i % 16] = x32[i * pairs + p];
#pragma omp parallel
    {
        TileConfig config = {0};
        config.palette = 1;
        for (int t = 0; t < 3; t++) {
            config.rows[t] = 16;
            config.colsb[t] = 64;
        }
        _tile_loadconfig(&config);
        float out[16 * 16];
#pragma omp for schedule(static)
        for (int64_t jb = 0; jb < n / 16; jb++) {
            for (int64_t cb = 0; cb < mblocks; cb++) {
                _tile_zero(0);
                for (int64_t c = 0; c < k; c += 32) {
                    _tile_loadd(1, w + jb * 16 * k + c, k * 2);
                    _tile_loadd(2, packed + (cb * pairs + c / 2) * 16, 64);
                    _tile_dpbf16ps(0, 1, 2);
                }
                _tile_stored(0, out, 64);
                int64_t cols = m - cb * 16 < 16 ? m - cb * 16 : 16;
                for (int r = 0; r < 16; r++)
                    for (int64_t col = 0; col < cols; col++)
                        y[(cb * 16 + col) * n + jb * 16 + r] = round_bf16(out[r * 16 + col]);
            }
        }
        _tile_release();
    }
    free(packed);
}

/* AMX where the shape allows, the dot-product loop for the rest: the choice depends on the weight's
 * shape only, never on m, so a row's bits never depend on how many rows run with it. */
static void gemm(const bf16 *w, const bf16 *x, bf16 *y, int64_t n, int64_t k, int64_t m) {
    if (!amx_ready || k % 32 != 0 || n < 16) {
        gemm_dot(w, x, y, n, k, m, n, 0);
        return;
    }
    gemm_amx(w, x, y, n, k, m);
    if (n % 16) gemm_dot(w, x, y, n, k, m, n % 16, n - n % 16);
}

static void gemv(const bf16 *w, const bf16 *x, bf16 *y, int64_t n, int64_t k) { gemm(w, x, y, n, k, 1); }

/* The products for exact mode (and the LM head's one row): y [m, n] = x [m, k] . w [n, k]^T. */
void linear_rows(const bf16 *w, const bf16 *x, bf16 *y, int64_t n, int64_t k, int64_t m) { gemm(w, x, y, n, k, m); }

static void add_bias(bf16 *y, const bf16 *bias, int64_t n) {
    if (bias)
        for (int64_t j = 0; j < n; j++) y[j] = round_bf16(f32(y[j]) + f32(bias[j]));
}

/* LlamaRMSNorm: float32 normalisation, rounded to bf16, then times the bf16 weight. */
static void rms_norm(const bf16 *x, const bf16 *weight, bf16 *out, int64_t n, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += f32(x[i]) * f32(x[i]);
    float scale = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = round_bf16(f32(weight[i]) * f32(round_bf16(f32(x[i]) * scale)));
}

/* Gemma's RMSNorm: the float32 normalisation times the float32 factor 1 + w, rounded to bf16 once
 * (Gemma3RMSNorm casts only its result). In place is fine: x[i] is read before out[i] is written. */
static void gemma_rms(const bf16 *x, const float *factor, bf16 *out, int64_t n, float eps) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += f32(x[i]) * f32(x[i]);
    float scale = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = round_bf16((f32(x[i]) * scale) * factor[i]);
}

/* A layer's norm of one row: Llama's rounding, or Gemma's. */
static void layer_rms(int gemma, const bf16 *x, const void *weight, bf16 *out, int64_t n, float eps) {
    if (gemma)
        gemma_rms(x, (const float *)weight, out, n, eps);
    else
        rms_norm(x, (const bf16 *)weight, out, n, eps);
}

/* x * cos + rotate_half(x) * sin, each product and the sum rounded to bf16, in place. */
static void rope(bf16 *x, const bf16 *cos, const bf16 *sin, int64_t dim) {
    int64_t half = dim / 2;
    bf16 out[dim];
    for (int64_t i = 0; i < dim; i++) {
        float rotated = i < half ? -f32(x[i + half]) : f32(x[i - half]);
        out[i] = round_bf16(f32(round_bf16(f32(x[i]) * f32(cos[i]))) + f32(round_bf16(rotated * f32(sin[i]))));
    }
    for (int64_t i = 0; i < dim; i++) x[i] = out[i];
}

static inline __m512 load_f32(const bf16 *p, int64_t left) {
    __mmask16 mask = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

/* e^x for 16 lanes: x = n ln2 + r (Cody-Waite split), e^r by its degree-7 Taylor polynomial on
 * |r| <= ln2/2 (error below one float32 ulp), times 2^n. A fixed formula, so every path that calls
 * it rounds alike; libm's expf is scalar and three times slower here. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 16 float32 lanes -> bf16, round to nearest even as round_bf16 does (NaN lanes stay NaN). */
static inline __m256i round16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i up = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    up = _mm512_mask_mov_epi32(up, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(up);
}

static inline __m512 load_f32_rounded(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(round16(v)), 16));
}

static inline void store16(bf16 *p, __m512 v, int64_t left) {
    __mmask16 mask = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1u);
    _mm256_mask_storeu_epi16(p, mask, round16(v));
}

#define MAX_DIM 512 /* head_dim limit of the vector accumulators below (kernel.py checks it) */

#define MAX_GROUP 4 /* query heads attended together, sharing each key and value load */

/* Row r of `seg`, the `group` query heads that share kv head `kv` (q and out: the first one's):
 * for each, softmax(q . K / sqrt(dim)) V over the positions the row may see, in position order.
 * Each head's sums are the one-head loop's, in the same order, so its bits depend neither on the
 * forward the row is part of nor on how its heads are grouped; a group loads each key and value
 * once for all its heads (GQA heads read the same cache) instead of once per head. Inlined with
 * constant `group` and `chunks` where it can be, so the queries and sums stay in registers. */
static inline __attribute__((always_inline)) void attend_heads(const Shape *s, const Segment *seg, int64_t r,
                                                               int64_t kv, const bf16 *q, bf16 *out, int group,
                                                               int64_t chunks, int64_t window) {
    int64_t dim = s->head_dim;
    const bf16 *keys = seg->keys + kv * seg->capacity * dim;
    const bf16 *values = seg->values + kv * seg->capacity * dim;
    int64_t visible = seg->start + seg->length;
    float *scores = malloc((size_t)(visible * group) * sizeof(float));
    int64_t *slots = malloc((size_t)visible * sizeof(int64_t));
    int64_t count = 0;
    for (int64_t t = 0; t < seg->start; t++) slots[count++] = t;
    for (int64_t j = 0; j < seg->length; j++)
        if (seg->mask ? seg->mask[r * seg->length + j] : j <= r) slots[count++] = seg->start + j;
    /* slots[i] holds position i (a tree row sees one ancestor a depth), so the row sits at position
     * count - 1, and in a window sees positions count - window .. count - 1 */
    int64_t from = window > 0 && count > window ? count - window : 0;
    slots += from;
    count -= from;
    __m512 qv[MAX_GROUP][MAX_DIM / 16], acc[MAX_GROUP][MAX_DIM / 16], kc[MAX_DIM / 16];
    float top[MAX_GROUP], total[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        for (int64_t c = 0; c < chunks; c++) {
            qv[g][c] = load_f32(q + g * dim + c * 16, dim - c * 16);
            acc[g][c] = _mm512_setzero_ps();
        }
        top[g] = -INFINITY;
        total[g] = 0.0f;
    }
    float scale = s->scale > 0.0f ? s->scale : 1.0f / sqrtf((float)dim), cap = s->softcap;
    for (int64_t i = 0; i < count; i++) {
        const bf16 *kt = keys + slots[i] * dim;
        for (int64_t c = 0; c < chunks; c++) kc[c] = load_f32(kt + c * 16, dim - c * 16);
        for (int g = 0; g < group; g++) {
            __m512 dot = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++) dot = _mm512_fmadd_ps(qv[g][c], kc[c], dot);
            float score = _mm512_reduce_add_ps(dot) * scale;
            if (cap > 0.0f) score = cap * tanhf(score / cap);
            scores[g * count + i] = score;
            if (score > top[g]) top[g] = score;
        }
    }
    for (int g = 0; g < group; g++) {
        float *row = scores + g * count;
        for (int64_t i = 0; i < count; i += 16) {
            __mmask16 mask = count - i >= 16 ? 0xffff : (__mmask16)((1u << (count - i)) - 1u);
            __m512 v = _mm512_maskz_loadu_ps(mask, row + i);
            _mm512_mask_storeu_ps(row + i, mask, exp16(_mm512_sub_ps(v, _mm512_set1_ps(top[g]))));
        }
    }
    for (int64_t i = 0; i < count; i++) {
        const bf16 *vt = values + slots[i] * dim;
        for (int64_t c = 0; c < chunks; c++) kc[c] = load_f32(vt + c * 16, dim - c * 16);
        for (int g = 0; g < group; g++) {
            float p = scores[g * count + i];
            total[g] += p;
            __m512 pv = _mm512_set1_ps(p);
            for (int64_t c = 0; c < chunks; c++) acc[g][c] = _mm512_fmadd_ps(pv, kc[c], acc[g][c]);
        }
    }
    for (int g = 0; g < group; g++) {
        float lanes[MAX_DIM];
        for (int64_t c = 0; c < chunks; c++) _mm512_storeu_ps(lanes + c * 16, acc[g][c]);
        for (int64_t i = 0; i < dim; i++) out[g * dim + i] = round_bf16(lanes[i] / total[g]);
    }
    free(scores);
    free(slots - from);
}

/* `attend_heads` for one job; the common shapes (head_dim 64 or 128, up to MAX_GROUP heads a
 * group) get a copy each with their constants, the rest the general loop. */
static void attend_job(const Shape *s, const Segment *seg, int64_t r, int64_t kv, const bf16 *q, bf16 *out,
                       int group, int64_t window) {
    int64_t chunks = (s->head_dim + 15) / 16;
#define ATTEND_CASE(G, C) \
    if (group == G && chunks == C) { attend_heads(s, seg, r, kv, q, out, G, C, window); return; }
    ATTEND_CASE(1, 4) ATTEND_CASE(2, 4) ATTEND_CASE(3, 4) ATTEND_CASE(4, 4)
    ATTEND_CASE(1, 8) ATTEND_CASE(2, 8) ATTEND_CASE(3, 8) ATTEND_CASE(4, 8)
#undef ATTEND_CASE
    attend_heads(s, seg, r, kv, q, out, group, chunks, window);
}

/* Qwen3's per-head norms where the layer has them (each head a row of head_dim, as Qwen3RMSNorm
 * rounds), RoPE on the first `rotary` dims of q and k of every row (cos/sin [rows, rotary]), then k
 * and v into each row's cache slot. qkv: [rows, qkv_size]. */
static void rope_and_store(const Shape *s, const Segment *segs, int64_t nseg, bf16 *qkv, const bf16 *cos,
                           const bf16 *sin, const void *q_norm, const void *k_norm, int gemma) {
    int64_t dim = s->head_dim, q_size = s->heads * dim, kv_size = s->kv_heads * dim;
    int64_t turned = s->rotary ? s->rotary : dim;
    int64_t row = 0;
    for (int64_t g = 0; g < nseg; g++) {
        const Segment *seg = &segs[g];
        for (int64_t r = 0; r < seg->length; r++, row++) {
            bf16 *q = qkv + row * (q_size + 2 * kv_size), *k = q + q_size, *v = k + kv_size;
            const bf16 *c = cos + row * turned, *sn = sin + row * turned;
            for (int64_t h = 0; h < s->heads; h++) {
                if (q_norm) layer_rms(gemma, q + h * dim, q_norm, q + h * dim, dim, s->eps);
                rope(q + h * dim, c, sn, turned);
            }
            for (int64_t h = 0; h < s->kv_heads; h++) {
                if (k_norm) layer_rms(gemma, k + h * dim, k_norm, k + h * dim, dim, s->eps);
                rope(k + h * dim, c, sn, turned);
                bf16 *kc = seg->keys + (h * seg->capacity + seg->start + r) * dim;
                bf16 *vc = seg->values + (h * seg->capacity + seg->start + r) * dim;
                for (int64_t i = 0; i < dim; i++) { kc[i] = k[h * dim + i]; vc[i] = v[h * dim + i]; }
            }
        }
    }
}

/* Attention for every row and head: out [rows, heads * head_dim]. A job is one row and a group of
 * query heads that share a kv head: the largest group (a divisor of the heads per kv head, at most
 * MAX_GROUP) that still leaves every thread four jobs, so a one-row step keeps its threads busy. */
static void attend_all(const Shape *s, const Segment *segs, int64_t nseg, int64_t rows, const bf16 *qkv,
                       int64_t window, bf16 *out) {
    int64_t dim = s->head_dim, stride = (s->heads + 2 * s->kv_heads) * dim;
    int64_t shared = s->heads / s->kv_heads, wanted = 4 * (int64_t)omp_get_max_threads();
    int group = 1;
    for (int g = MAX_GROUP; g > 1 && group == 1; g--)
        if (shared % g == 0 && rows * (s->heads / g) >= wanted) group = g;
    int64_t per_row = s->heads / group;
    int64_t seg_of[rows], first[nseg];
    for (int64_t g = 0, row = 0; g < nseg; g++) {
        first[g] = row;
        for (int64_t r = 0; r < segs[g].length; r++) seg_of[row++] = g;
    }
#pragma omp parallel for schedule(static)
    for (int64_t job = 0; job < rows * per_row; job++) {
        int64_t row = job / per_row, h = (job % per_row) * group, g = seg_of[row];
        attend_job(s, &segs[g], row - first[g], h / shared, qkv + row * stride + h * dim,
                   out + row * s->heads * dim + h * dim, group, window);
    }
}

/* The rows path, between the weight products: RoPE, the cache writes and attention for a layer.
 * segs: this layer's segments (their rows in order); qkv [rows, qkv_size]; out [rows, heads dim]. */
void attend_rows(const Shape *s, const Segment *segs, int64_t nseg, bf16 *qkv, const bf16 *cos, const bf16 *sin,
                 bf16 *out) {
    int64_t rows = 0;
    for (int64_t g = 0; g < nseg; g++) rows += segs[g].length;
    rope_and_store(s, segs, nseg, qkv, cos, sin, NULL, NULL, 0);
    attend_all(s, segs, nseg, rows, qkv, 0, out);
}

/* x += delta (rounded, skipped when delta is NULL), then out = RMSNorm(x) * weight, for each row. */
void add_norm(bf16 *x, const bf16 *delta, const bf16 *weight, bf16 *out, int64_t rows, int64_t hidden, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        bf16 *xr = x + r * hidden;
        if (delta)
            for (int64_t i = 0; i < hidden; i++) xr[i] = round_bf16(f32(xr[i]) + f32(delta[r * hidden + i]));
        if (weight) rms_norm(xr, weight, out + r * hidden, hidden, eps);
    }
}

/* act = SiLU(gate) * up per row, each rounded to bf16; gate_up [rows, 2 * inter]. */
void silu_mul(const bf16 *gate_up, bf16 *act, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = gate_up + r * 2 * inter, *up = gate + inter;
        for (int64_t i = 0; i < inter; i += 16) {
            int64_t left = inter - i;
            __m512 g = load_f32(gate + i, left);
            __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
            __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            store16(act + r * inter + i, _mm512_mul_ps(load_f32_rounded(silu), load_f32(up + i, left)), left);
        }
    }
}

/* act = GELU(gate) * up per row, GELU's tanh form (Gemma's), each rounded to bf16 as torch rounds:
 * 0.5 g (1 + tanh(u)) with u = sqrt(2 / pi) (g + 0.044715 g^3), computed as g / (1 + e^(-2u)), the
 * same value (0.5 (1 + tanh u) is the logistic of 2u), in float32 as torch computes a bf16 GELU. */
void gelu_mul(const bf16 *gate_up, bf16 *act, int64_t rows, int64_t inter) {
    const __m512 c = _mm512_set1_ps(0.7978845608f), cubic = _mm512_set1_ps(0.044715f), one = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < rows; r++) {
        const bf16 *gate = gate_up + r * 2 * inter, *up = gate + inter;
        for (int64_t i = 0; i < inter; i += 16) {
            int64_t left = inter - i;
            __m512 g = load_f32(gate + i, left);
            __m512 u = _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(cubic, g), _mm512_mul_ps(g, g), g));
            __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
            __m512 gelu = _mm512_div_ps(g, _mm512_add_ps(one, e));
            store16(act + r * inter + i, _mm512_mul_ps(load_f32_rounded(gelu), load_f32(up + i, left)), left);
        }
    }
}

/* x += delta (rounded, skipped when delta is NULL), then out = Gemma's RMSNorm(x) with the float32
 * factors `weight` (skipped when NULL), for each row: the Gemma form of add_norm. */
void add_gemma_norm(bf16 *x, const bf16 *delta, const float *weight, bf16 *out, int64_t rows, int64_t hidden,
                    float eps) {
    for (int64_t r = 0; r < rows; r++) {
        bf16 *xr = x + r * hidden;
        if (delta)
            for (int64_t i = 0; i < hidden; i++) xr[i] = round_bf16(f32(xr[i]) + f32(delta[r * hidden + i]));
        if (weight) gemma_rms(xr, weight, out + r * hidden, hidden, eps);
    }
}

/* A layer's add-and-norm over rows, in its own norms' form. */
static void layer_add_norm(const Layer *layer, bf16 *x, const bf16 *delta, const void *weight, bf16 *out,
                           int64_t rows, int64_t hidden, float eps) {
    if (layer->gemma)
        add_gemma_norm(x, delta, (const float *)weight, out, rows, hidden, eps);
    else
        add_norm(x, delta, (const bf16 *)weight, out, rows, hidden, eps);
}

/* `count` layers over `rows` rows in one call (a verify step, a batch of sequences, a decode step):
 * each layer's segments at segs[l * nseg ..] (their rows in order). One call instead of seven per
 * layer from Python, whose overhead was about a tenth of a few-row step on the default model. x:
 * [rows, hidden] bf16, updated in place (the residual stream); scratch: bf16 room for rows x (2
 * hidden + qkv_size + heads head_dim + 3 intermediate). */
void decode_rows(const Shape *s, const Layer *layers, int64_t count, const Segment *segs, int64_t nseg,
                 int64_t rows, const bf16 *cos, const bf16 *sin, bf16 *x, bf16 *scratch) {
    int64_t hidden = s->hidden, dim = s->head_dim, inter = s->intermediate;
    int64_t q_size = s->heads * dim, kv_size = s->kv_heads * dim, qkv_size = q_size + 2 * kv_size;
    bf16 *h = scratch, *delta = h + rows * hidden, *qkv = delta + rows * hidden, *att = qkv + rows * qkv_size;
    bf16 *gate_up = att + rows * q_size, *act = gate_up + rows * 2 * inter;
    for (int64_t l = 0; l < count; l++) {
        const Layer *layer = &layers[l];
        layer_add_norm(layer, x, NULL, layer->input_norm, h, rows, hidden, s->eps);
        gemm(layer->qkv, h, qkv, qkv_size, hidden, rows);
        for (int64_t r = 0; r < rows; r++) add_bias(qkv + r * qkv_size, layer->qkv_bias, qkv_size);
        rope_and_store(s, segs + l * nseg, nseg, qkv, layer->cos ? layer->cos : cos, layer->sin ? layer->sin : sin,
                       layer->q_norm, layer->k_norm, (int)layer->gemma);
        attend_all(s, segs + l * nseg, nseg, rows, qkv, layer->window, att);
        gemm(layer->o, att, delta, hidden, q_size, rows);
        for (int64_t r = 0; r < rows; r++) add_bias(delta + r * hidden, layer->o_bias, hidden);
        if (layer->attn_out_norm) add_gemma_norm(delta, NULL, layer->attn_out_norm, delta, rows, hidden, s->eps);
        layer_add_norm(layer, x, delta, layer->post_norm, h, rows, hidden, s->eps);
        gemm(layer->gate_up, h, gate_up, 2 * inter, hidden, rows);
        (layer->gemma ? gelu_mul : silu_mul)(gate_up, act, rows, inter);
        gemm(layer->down, act, delta, hidden, inter, rows);
        if (layer->mlp_out_norm) add_gemma_norm(delta, NULL, layer->mlp_out_norm, delta, rows, hidden, s->eps);
        add_norm(x, delta, NULL, NULL, rows, hidden, s->eps);
    }
}

/* Run `count` layers on the hidden state x ([hidden] bf16, updated in place) of the token at
 * position `pos`, writing its keys and values at `pos` of each layer's cache (the caller has made
 * room): `decode_rows` over one row, one segment a layer. cos/sin: [rotary] bf16 for this position;
 * scratch: what `decode_rows` needs for one row. */
void decode_layers(const Shape *s, const Layer *layers, int64_t count, int64_t pos, const bf16 *cos,
                   const bf16 *sin, bf16 *x, bf16 *scratch) {
    Segment segs[count];
    for (int64_t l = 0; l < count; l++) segs[l] = (Segment){layers[l].keys, layers[l].values, layers[l].capacity, pos, 1, NULL};
    decode_rows(s, layers, count, segs, 1, 1, cos, sin, x, scratch);
}
