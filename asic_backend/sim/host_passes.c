/* The host passes around a DUT GEMM, one loop each: asic_backend/sim/host_passes.py builds and
 * loads this file. Every value equals the aten formula's bit for bit, which needs IEEE float32
 * arithmetic in source order: the build passes -ffp-contract=off (a fused multiply-add rounds
 * once where the formula rounds twice) and never a fast-math flag.
 *
 * The loops are plain C that compilers vectorize (-O3); rows are shared among OpenMP threads
 * when the caller asks for more than one (the runtime is torch's own: same soname, loaded). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* 1.5 * 2^23: (v + ROUNDER) - ROUNDER is v rounded half to even (torch.round), for |v| < 2^22
 * under the default rounding mode. */
#define ROUNDER 12582912.0f

/* Bits of |v|: non-negative floats order as their bit patterns; inf and NaN are >= INF_BITS. */
#define INF_BITS 0x7f800000u

static inline uint32_t abs_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

/* The symmetric scale of values whose largest |x| has the (finite) bits top:
 * max(max|x| / 127.5, eps). */
static inline float scale_of(uint32_t top, float eps) {
    float amax;
    memcpy(&amax, &top, sizeof amax);
    const float s = amax / 127.5f;
    return s < eps ? eps : s;
}

/* The symmetric scale of k values into *scale; returns 1, writing nothing, if they hold inf or
 * NaN. */
static int sym_scale(const float *x, int64_t k, float eps, float *scale) {
    uint32_t top = 0;
    for (int64_t i = 0; i < k; i++) {
        uint32_t b = abs_bits(x[i]);
        top = b > top ? b : top;
    }
    if (top >= INF_BITS) return 1;
    *scale = scale_of(top, eps);
    return 0;
}

/* clamp(round(x * recip), -128, 127), rounded half to even but for the sign of a zero (see
 * quantize_row). Clamping before rounding gives the same values: rounding is monotone and the
 * bounds are integers. */
static inline float quantized(float x, float recip) {
    float v = x * recip;
    v = v < -128.0f ? -128.0f : v;
    v = v > 127.0f ? 127.0f : v;
    return (v + ROUNDER) - ROUNDER;
}

/* quantized(x, recip) as an integer, the same value, where |x * recip| stays within 2^22 (a
 * finite recip of a row's or column's own scale keeps it near 127.5): the rounding trick needs
 * no clamp before it, and clamping the integer after gives the same values (rounding is
 * monotone, the bounds are integers). Compilers vectorize the integer clamp as min/max, where
 * the float clamp before the rounding became mask shuffles: 512 x 8192 rows quantized in 1.23
 * ms against 4.92 ms in AVX2 code, and 1.04 ms against 1.38 ms with 512-bit vectors (one
 * thread, Xeon with AMX; docs/device.md). */
static inline int32_t quantized_int(float x, float recip) {
    int32_t v = (int32_t)((x * recip + ROUNDER) - ROUNDER);
    v = v < -128 ? -128 : v;
    return v > 127 ? 127 : v;
}

/* q[i] = quantized(x[i], recip) for k values, as integers of OUT_T: by quantized_int where
 * recip is finite, else (a zero scale, eps 0: no bound on x * recip) through the float clamp. */
#define QUANTIZE_RUN(NAME, OUT_T)                                                              \
    static inline void NAME(const float *x, int64_t k, float recip, OUT_T *q) {                \
        if (isfinite(recip)) {                                                                 \
            for (int64_t i = 0; i < k; i++) q[i] = (OUT_T)quantized_int(x[i], recip);          \
        } else {                                                                               \
            for (int64_t i = 0; i < k; i++) q[i] = (OUT_T)(int32_t)quantized(x[i], recip);     \
        }                                                                                      \
    }

QUANTIZE_RUN(quantize_i8, int8_t)
QUANTIZE_RUN(quantize_i16, int16_t)

/* One row: q = quantized(x, 1 / scale). Returns 1, writing nothing, if the row holds inf or
 * NaN. */
static int quantize_row(const float *x, int64_t k, int8_t *q, float *q_f32, float *scale,
                        float eps) {
    if (sym_scale(x, k, eps, scale)) return 1;
    const float recip = 1.0f / *scale;
    if (q_f32) {
        /* The sign too: torch.round keeps -0.0 (-0.25 rounds to -0.0), the trick gives +0. */
        for (int64_t i = 0; i < k; i++) q_f32[i] = copysignf(quantized(x[i], recip), x[i]);
    } else {
        quantize_i8(x, k, recip, q);
    }
    return 0;
}

/* Symmetric per-row int8 of rows x rows of k floats (row r at x + r * x_stride) into q (int8,
 * rows x k) or, if q_f32 is given, into q_f32 (the same values as float32); scales into
 * scale[rows]. Returns the number of rows holding inf or NaN (their outputs are not written). */
int64_t asic_quantize_sym_f32(const float *x, int64_t rows, int64_t k, int64_t x_stride,
                              int8_t *q, float *q_f32, float *scale, float eps, int threads) {
    int64_t bad = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : bad) if (threads > 1)
    for (int64_t r = 0; r < rows; r++) {
        bad += quantize_row(x + r * x_stride, k, q ? q + r * k : 0, q_f32 ? q_f32 + r * k : 0,
                            scale + r, eps);
    }
    return bad;
}

/* Symmetric per-column int8 of a batch of matrices x [batch, rows, cols] (contiguous) into q
 * (int8, x's layout), scales into scale[batch * cols]: each column as asic_quantize_sym_f32
 * takes a row, without the transposed copy a row-major pass would need (attention's V, a
 * matmul's right operand). Returns the number of matrices holding inf or NaN (their outputs
 * are not all written). */
int64_t asic_quantize_sym_cols_f32(const float *x, int64_t batch, int64_t rows, int64_t cols,
                                   int8_t *q, float *scale, float eps, int threads) {
    int64_t bad = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : bad) if (threads > 1)
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x + b * rows * cols;
        int8_t *qb = q + b * rows * cols;
        float *sb = scale + b * cols;
        uint32_t *top = calloc((size_t)cols, sizeof *top);
        float *recip = malloc((size_t)cols * sizeof *recip);
        if (!top || !recip) { /* the caller runs the aten kernels */
            free(top);
            free(recip);
            bad++;
            continue;
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *row = xb + r * cols;
            for (int64_t j = 0; j < cols; j++) {
                uint32_t u = abs_bits(row[j]);
                top[j] = u > top[j] ? u : top[j];
            }
        }
        int finite = 1, bounded = 1;
        for (int64_t j = 0; j < cols; j++) {
            if (top[j] >= INF_BITS) {
                finite = 0;
                break;
            }
            sb[j] = scale_of(top[j], eps);
            recip[j] = 1.0f / sb[j];
            bounded &= isfinite(recip[j]) != 0;
        }
        if (finite) {
            for (int64_t r = 0; r < rows; r++) {
                const float *row = xb + r * cols;
                int8_t *out = qb + r * cols;
                if (bounded) {
                    for (int64_t j = 0; j < cols; j++)
                        out[j] = (int8_t)quantized_int(row[j], recip[j]);
                } else { /* a zero scale (eps 0): no bound on x * recip */
                    for (int64_t j = 0; j < cols; j++)
                        out[j] = (int8_t)(int32_t)quantized(row[j], recip[j]);
                }
            }
        } else {
            bad++;
        }
        free(top);
        free(recip);
    }
    return bad;
}

/* y = ((float)acc * a[i]) * b[j] + bias, each step rounded to float32, as numerics.scale_acc
 * (linears: b one a column or one for all, bias one a column) and ops.conv's rescale (convs:
 * no b, bias one a row) compute it. a_step, b_step: 1 for a value a row (a) or a column (b), 0
 * for one for all; b_rows: 0, or the rows of each matrix of a batch [B, m / b_rows, n] whose
 * own column scales follow the last matrix's in b (attention's scores); b and bias may be
 * NULL; bias_row_step / bias_col_step: 1 and 0 for a value a row, 0 and 1 for a value a
 * column. y's rows lie y_stride values apart (n, or the whole output's width where acc is a
 * tile of its columns: b, bias and y then point at the tile's first column, and b_rows is 0,
 * as a batch's scales are indexed by n). y may be acc's own memory where y_stride is n: each
 * value is read before it is written, in the same iteration (ivdep: no dependence between
 * iterations, so no scalar fallback for it). */
#define SCALE_LOOP(EXPR)                                                                       \
    do {                                                                                       \
        _Pragma("GCC ivdep") for (int64_t j = 0; j < n; j++) {                                 \
            float v = (float)row[j] * ai;                                                      \
            out[j] = EXPR;                                                                     \
        }                                                                                      \
    } while (0)

/* One row of it: out[j] for the row's acc values, its scale ai, its column scales b (b_step
 * apart, or NULL) and its bias (bias_col_step apart, or NULL). */
#define SCALE_ROW(NAME, ACC_T)                                                                 \
    static inline void NAME(const ACC_T *row, int64_t n, float ai, const float *b,            \
                            int64_t b_step, const float *bias_i, int64_t bias_col_step,        \
                            float *out) {                                                      \
        if (b && b_step && bias_i && bias_col_step) {                                          \
            SCALE_LOOP((v * b[j]) + bias_i[j]);                                                \
        } else if (b && b_step && !bias_i) {                                                   \
            SCALE_LOOP(v * b[j]);                                                              \
        } else if (b && bias_i && bias_col_step) {                                             \
            const float b0 = b[0];                                                             \
            SCALE_LOOP((v * b0) + bias_i[j]);                                                  \
        } else if (b && !bias_i) {                                                             \
            const float b0 = b[0];                                                             \
            SCALE_LOOP(v * b0);                                                                \
        } else if (!b && bias_i && !bias_col_step) {                                           \
            const float bi = bias_i[0];                                                        \
            SCALE_LOOP(v + bi);                                                                \
        } else if (!b && !bias_i) {                                                            \
            SCALE_LOOP(v);                                                                     \
        } else { /* not asked for by host_passes.py; correct, if slower */                      \
            for (int64_t j = 0; j < n; j++) {                                                  \
                float v = (float)row[j] * ai;                                                  \
                if (b) v = v * b[j * b_step];                                                  \
                if (bias_i) v = v + bias_i[j * bias_col_step];                                 \
                out[j] = v;                                                                    \
            }                                                                                  \
        }                                                                                      \
    }

#define SCALE_ROWS(NAME, ROW, ACC_T)                                                           \
    void NAME(const ACC_T *acc, int64_t m, int64_t n, const float *a, int64_t a_step,          \
              const float *b_all, int64_t b_step, int64_t b_rows, const float *bias,            \
              int64_t bias_row_step, int64_t bias_col_step, float *y, int64_t y_stride,         \
              int threads) {                                                                    \
        _Pragma("omp parallel for num_threads(threads) if (threads > 1)")                       \
        for (int64_t i = 0; i < m; i++) {                                                      \
            const float *b = b_all && b_rows ? b_all + (i / b_rows) * n * b_step : b_all;     \
            ROW(acc + i * n, n, a[i * a_step], b, b_step, bias ? bias + i * bias_row_step : 0, \
                bias_col_step, y + i * y_stride);                                              \
        }                                                                                      \
    }

SCALE_ROW(scale_row_i32, int32_t)
SCALE_ROW(scale_row_f32, float)
SCALE_ROWS(asic_scale_i32, scale_row_i32, int32_t)
SCALE_ROWS(asic_scale_f32, scale_row_f32, float)

/* The int16 kernel's GEMM of activations already widened (int16_gemm.c). */
int64_t asic_int16_gemm_a16(const int16_t *a16, int64_t m, int64_t k, const int8_t *packed,
                            int64_t n, int32_t *out, int64_t ldo, int threads);

/* A dynamic int8 linear by a weight packed for the int16 kernel, in one call: each row of x
 * (float32, m x k, rows x_stride apart) quantized as asic_quantize_sym_f32 quantizes it, its
 * scale into x_scale[m] and its values straight into a16 (m x even(k) int16: the kernel's
 * widened activations, with no int8 copy to widen again); the GEMM into acc (m x n int32); and
 * y = acc * x_scale[i] * w_scale[j * w_step] (+ bias[j]), as asic_scale_i32 computes it. The
 * values are those of the three steps apart. Returns the number of rows holding inf or NaN,
 * with nothing done after the quantization (the caller takes its general path), or -1 where
 * the build has no int16 kernel. */
int64_t asic_linear_int16(const float *x, int64_t m, int64_t k, int64_t x_stride,
                          const int8_t *packed, int64_t n, const float *w_scale, int64_t w_step,
                          const float *bias, float eps, float *x_scale, int16_t *a16,
                          int32_t *acc, float *y, int q_threads, int gemm_threads,
                          int scale_threads) {
    const int64_t kp = (k + 1) & ~(int64_t)1;
    int64_t bad = 0;
#pragma omp parallel for num_threads(q_threads) reduction(+ : bad) if (q_threads > 1)
    for (int64_t r = 0; r < m; r++) {
        const float *row = x + r * x_stride;
        int16_t *q = a16 + r * kp;
        if (sym_scale(row, k, eps, x_scale + r)) {
            bad++;
            continue;
        }
        quantize_i16(row, k, 1.0f / x_scale[r], q);
    }
    if (bad) return bad;
    if (asic_int16_gemm_a16(a16, m, k, packed, n, acc, n, gemm_threads)) return -1;
    asic_scale_i32(acc, m, n, x_scale, 1, w_scale, w_step, 0, bias, 0, 1, y, n, scale_threads);
    return 0;
}

/* The amx kernel (amx_gemm.c): its activations' row stride and buffer, and its GEMM, which hands
 * each block of the product to a sink while the block is in L1. */
int64_t asic_amx_lda(int64_t k);
int64_t asic_amx_a_bytes(int64_t m, int64_t k);
int asic_amx_available(void);
typedef void (*asic_amx_sink)(void *ctx, const int32_t *block, int64_t ld, int64_t i0,
                              int64_t rows, int64_t j0, int64_t cols);
int asic_amx_gemm_sink(const int8_t *a, int64_t m, int64_t k, const int8_t *packed, int64_t n,
                       asic_amx_sink sink, void *ctx, int threads);

struct linear_rescale {
    const float *x_scale, *w_scale, *bias;
    int64_t w_step, n;
    float *y;
};

/* A block of a linear's product rescaled as asic_scale_i32 rescales the whole, row by row (the
 * same values), into y's rows. */
static void rescale_block(void *ctx, const int32_t *block, int64_t ld, int64_t i0, int64_t rows,
                          int64_t j0, int64_t cols) {
    const struct linear_rescale *r = ctx;
    for (int64_t i = 0; i < rows; i++)
        scale_row_i32(block + i * ld, cols, r->x_scale[i0 + i], r->w_scale + j0 * r->w_step,
                      r->w_step, r->bias ? r->bias + j0 : 0, 1, r->y + (i0 + i) * r->n + j0);
}

/* A dynamic int8 linear by a weight packed for the amx kernel, in one call: each row of x
 * (float32, m x k, rows x_stride apart) quantized as asic_quantize_sym_f32 quantizes it, its
 * scale into x_scale[m] and its values straight into the kernel's activations buffer a
 * (asic_amx_a_bytes(m, k), padded with zeros); the GEMM; and each block of it rescaled into y
 * (m x n) as asic_scale_i32 computes it. The values are those of the three steps apart. Returns
 * the number of rows holding inf or NaN, with nothing done after the quantization (the caller
 * takes its general path), -1 where the build or the process has no AMX, or -2 where the sums
 * of a long K found no memory. */
int64_t asic_linear_amx(const float *x, int64_t m, int64_t k, int64_t x_stride,
                        const int8_t *packed, int64_t n, const float *w_scale, int64_t w_step,
                        const float *bias, float eps, float *x_scale, int8_t *a, float *y,
                        int q_threads, int gemm_threads) {
    if (!asic_amx_available()) return -1;
    /* The buffer's rows: m padded to the kernel's tiles (asic_amx_a_bytes). */
    const int64_t lda = asic_amx_lda(k), mp = asic_amx_a_bytes(m, k) / lda;
    int64_t bad = 0;
#pragma omp parallel for num_threads(q_threads) reduction(+ : bad) if (q_threads > 1)
    for (int64_t r = 0; r < mp; r++) {
        int8_t *q = a + r * lda;
        if (r >= m) { /* the tile's padding rows */
            memset(q, 0, (size_t)lda);
            continue;
        }
        const float *row = x + r * x_stride;
        if (sym_scale(row, k, eps, x_scale + r)) {
            bad++;
            continue;
        }
        quantize_i8(row, k, 1.0f / x_scale[r], q);
        memset(q + k, 0, (size_t)(lda - k));
    }
    if (bad) return bad;
    struct linear_rescale ctx = {x_scale, w_scale, bias, w_step, n, y};
    return asic_amx_gemm_sink(a, m, k, packed, n, rescale_block, &ctx, gemm_threads);
}

/* A depthwise 2-D convolution with its quantization and rescale fused, a plane at a time: x
 * float32 [n, c, h, w] (contiguous) is quantized per sample as asic_quantize_sym_f32 does it
 * (scales into x_scale[n]), each plane into a zero-padded buffer, convolved with its channel's
 * int8 weights wq [c, kh, kw] (as float32), and rescaled: y = acc * (x_scale[n] * w_scale[c])
 * (+ bias[c]), each step rounded to float32, as ops.conv rescales an accumulator. The sums are
 * exact in float32 in any order: kh * kw <= 1024 products of at most 2^14 (the caller checks).
 * Padding pt (top) and pl (left); the output's size oh x ow; scratch: threads buffers of
 * ((oh - 1) * sh + (kh - 1) * dh + 1) * ((ow - 1) * sw + (kw - 1) * dw + 1) + ow floats, one a
 * thread. Returns the number of samples holding inf or NaN (then nothing after the scales is
 * written). */
int64_t asic_depthwise_f32(const float *x, int64_t n, int64_t c, int64_t h, int64_t w,
                           const float *wq, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                           int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh,
                           int64_t ow, const float *w_scale, const float *bias, float eps,
                           float *x_scale, float *y, float *scratch, int threads) {
    const int64_t plane = h * w;
    int64_t bad = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : bad) if (threads > 1)
    for (int64_t s = 0; s < n; s++) {
        bad += sym_scale(x + s * c * plane, c * plane, eps, x_scale + s);
    }
    if (bad) return bad;
    /* The padded rows and columns the output reads (bottom and right padding included). */
    const int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1;
    const int64_t wp = (ow - 1) * sw + (kw - 1) * dw + 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#ifdef _OPENMP
        float *buf = scratch + (int64_t)omp_get_thread_num() * (hp * wp + ow);
#else
        float *buf = scratch;
#endif
        float *acc = buf + hp * wp;
#pragma omp for
        for (int64_t p = 0; p < n * c; p++) {
            const int64_t s = p / c, ch = p % c;
            const float *xp = x + p * plane;
            const float recip = 1.0f / x_scale[s];
            const float out_scale = x_scale[s] * w_scale[ch];
            const float *wc = wq + ch * kh * kw;
            float *yp = y + p * oh * ow;
            memset(buf, 0, sizeof(float) * (size_t)(hp * wp));
            for (int64_t r = 0; r < h && r + pt < hp; r++) {
                float *dst = buf + (r + pt) * wp + pl;
                const float *src = xp + r * w;
                const int64_t cols = w < wp - pl ? w : wp - pl;
                for (int64_t i = 0; i < cols; i++) dst[i] = quantized(src[i], recip);
            }
            if (kh == 3 && kw == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1) {
                /* MobileNet's 3x3: the nine products of an output summed in registers. */
                const float w0 = wc[0], w1 = wc[1], w2 = wc[2], w3 = wc[3], w4 = wc[4];
                const float w5 = wc[5], w6 = wc[6], w7 = wc[7], w8 = wc[8];
                const float bc = bias ? bias[ch] : 0.0f;
                for (int64_t i = 0; i < oh; i++) {
                    const float *r0 = buf + i * wp, *r1 = r0 + wp, *r2 = r1 + wp;
                    float *out = yp + i * ow;
#pragma GCC ivdep
                    for (int64_t j = 0; j < ow; j++) {
                        /* From +0, as the separate convolution's sums start: a zero sum is +0. */
                        float v = 0.0f + r0[j] * w0 + r0[j + 1] * w1 + r0[j + 2] * w2 + r1[j] * w3 +
                                  r1[j + 1] * w4 + r1[j + 2] * w5 + r2[j] * w6 +
                                  r2[j + 1] * w7 + r2[j + 2] * w8;
                        v = v * out_scale;
                        out[j] = bias ? v + bc : v;
                    }
                }
                continue;
            }
            for (int64_t i = 0; i < oh; i++) {
                for (int64_t j = 0; j < ow; j++) acc[j] = 0.0f;
                for (int64_t a = 0; a < kh; a++) {
                    const float *row = buf + (i * sh + a * dh) * wp;
                    for (int64_t b = 0; b < kw; b++) {
                        const float wv = wc[a * kw + b];
                        const float *base = row + b * dw;
                        if (sw == 1) {
#pragma GCC ivdep
                            for (int64_t j = 0; j < ow; j++) acc[j] += base[j] * wv;
                        } else {
#pragma GCC ivdep
                            for (int64_t j = 0; j < ow; j++) acc[j] += base[j * sw] * wv;
                        }
                    }
                }
                float *out = yp + i * ow;
                if (bias) {
                    const float bc = bias[ch];
                    for (int64_t j = 0; j < ow; j++) out[j] = (acc[j] * out_scale) + bc;
                } else {
                    for (int64_t j = 0; j < ow; j++) out[j] = acc[j] * out_scale;
                }
            }
        }
    }
    return 0;
}
