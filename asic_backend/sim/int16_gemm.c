/* The int16 host kernel of asic_backend.sim.host_gemm: the DUT's int8 x int8 -> int32 GEMM,
 * exactly, on a CPU without an int8 dot-product unit (AVX2 alone).
 *
 * Each int8 value is widened to int16 and multiplied by AVX2's vpmaddwd, which adds the
 * products of neighbouring pairs into int32: |a0*w0 + a1*w1| <= 2^15, never saturating, and
 * every sum of K <= INT_MM_MAX_K of them stays within int32. So the result is the exact int32
 * product, in any order. torch's _int_mm has no such kernel (it is 10 to 30 times slower than a
 * float32 GEMM there), and the float32 GEMM reads 4 bytes a weight where this reads 1.
 *
 * A weight [N, K] is packed once (asic_int16_pack): panels of PANEL columns, each a run over K
 * in pairs, 2 x PANEL int8 a pair (the two halves of PANEL / 2 columns: one 16-byte load each,
 * widened to one register). K is padded to even, the last panel's columns with zeros. The
 * activations are widened to int16 into the caller's buffer (one int32 load broadcasts a pair).
 * A micro-tile is ROWS rows x PANEL columns held in registers over all of K; panels are taken a
 * group at a time (GROUP_BYTES of packed weight: the CPU's L2) for each block of rows, so a
 * block's activations are read from L1 for every panel of the group. OpenMP threads share the
 * (group, block of rows) pairs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define PANEL 16
#define ROWS 6
#define GROUP_BYTES (256 * 1024)

static inline int64_t even(int64_t k) { return (k + 1) & ~(int64_t)1; }

/* 1 if this build has the kernel (the compiler targets AVX2), else 0: the caller uses another. */
int asic_int16_available(void) {
#if defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* Bytes of a packed [n, k] weight. */
int64_t asic_int16_packed_bytes(int64_t n, int64_t k) {
    return (n + PANEL - 1) / PANEL * even(k) * PANEL;
}

/* Where a panel holds its column j's value of k = kk: pair kk / 2, the half of j's 8 columns. */
static inline int8_t *panel_at(int8_t *dst, int64_t j, int64_t kk) {
    return dst + (kk >> 1) * 2 * PANEL + (j / 8) * 16 + (j % 8) * 2 + (kk & 1);
}

/* Zero what a panel's values leave: its missing columns, an odd K's last half pair. */
static inline void clear_panel(int8_t *dst, int64_t cols, int64_t k) {
    if (cols < PANEL || k % 2) memset(dst, 0, (size_t)(even(k) * PANEL));
}

/* One panel of any layout, element by element: a panel of fewer columns, an odd K's last pair,
 * a layout the vector paths below do not take. */
static void pack_scalar(const int8_t *w, int64_t k0, int64_t k, int64_t sn, int64_t sk,
                        int64_t cols, int8_t *dst) {
    for (int64_t j = 0; j < cols; j++)
        for (int64_t kk = k0; kk < k; kk++) *panel_at(dst, j, kk) = w[j * sn + kk * sk];
}

#if defined(__AVX2__)
/* A panel of a weight whose rows are contiguous (sk = 1, a linear's [N, K], attention's K): as
 * int16, the panel is the transpose of its 16 rows of K / 2 pairs, 8 x 8 pairs at a time.
 * Returns the pairs it packed (a multiple of 8); the caller packs the rest. */
static int64_t pack_rows(const int8_t *w, int64_t k, int64_t sn, int8_t *dst) {
    int64_t pairs = k / 2 / 8 * 8;
    for (int64_t q = 0; q < pairs; q += 8)
        for (int half = 0; half < 2; half++) {
            const int8_t *src = w + half * 8 * sn + 2 * q;
            __m128i a[8], b[8], c[8];
            for (int r = 0; r < 8; r++) a[r] = _mm_loadu_si128((const __m128i *)(src + r * sn));
            for (int r = 0; r < 4; r++) {
                b[r] = _mm_unpacklo_epi16(a[2 * r], a[2 * r + 1]);
                b[r + 4] = _mm_unpackhi_epi16(a[2 * r], a[2 * r + 1]);
            }
            for (int r = 0; r < 2; r++) {
                /* b[0..3]: pairs 0-3 of rows (0,1), (2,3), (4,5), (6,7); b[4..7]: pairs 4-7 */
                c[4 * r + 0] = _mm_unpacklo_epi32(b[4 * r + 0], b[4 * r + 1]);
                c[4 * r + 1] = _mm_unpackhi_epi32(b[4 * r + 0], b[4 * r + 1]);
                c[4 * r + 2] = _mm_unpacklo_epi32(b[4 * r + 2], b[4 * r + 3]);
                c[4 * r + 3] = _mm_unpackhi_epi32(b[4 * r + 2], b[4 * r + 3]);
            }
            for (int r = 0; r < 2; r++) {
                int8_t *d = dst + (q + 4 * r) * 2 * PANEL + half * 16;
                __m128i lo = c[4 * r], hi = c[4 * r + 2], lo2 = c[4 * r + 1], hi2 = c[4 * r + 3];
                _mm_storeu_si128((__m128i *)(d + 0 * 2 * PANEL), _mm_unpacklo_epi64(lo, hi));
                _mm_storeu_si128((__m128i *)(d + 1 * 2 * PANEL), _mm_unpackhi_epi64(lo, hi));
                _mm_storeu_si128((__m128i *)(d + 2 * 2 * PANEL), _mm_unpacklo_epi64(lo2, hi2));
                _mm_storeu_si128((__m128i *)(d + 3 * 2 * PANEL), _mm_unpackhi_epi64(lo2, hi2));
            }
        }
    return pairs;
}

/* Pair q of a full panel from its 16 columns' values of k = 2q (r0) and 2q + 1 (r1): the two
 * interleaved byte by byte are its 32 bytes. */
static inline void store_pair(int8_t *dst, int64_t q, __m128i r0, __m128i r1) {
    _mm_storeu_si128((__m128i *)(dst + q * 2 * PANEL), _mm_unpacklo_epi8(r0, r1));
    _mm_storeu_si128((__m128i *)(dst + q * 2 * PANEL + 16), _mm_unpackhi_epi8(r0, r1));
}

/* A panel of a weight whose columns are contiguous (sn = 1: a [K, N] as its transposed view,
 * attention's V): a pair is its two rows of 16 columns. */
static void pack_columns(const int8_t *w, int64_t k, int64_t sk, int8_t *dst) {
    for (int64_t q = 0; q < k / 2; q++)
        store_pair(dst, q, _mm_loadu_si128((const __m128i *)(w + 2 * q * sk)),
                   _mm_loadu_si128((const __m128i *)(w + (2 * q + 1) * sk)));
}
#endif

/* Pack w (n x k int8; element (j, kk) at w[j * sn + kk * sk]) into out. */
void asic_int16_pack(const int8_t *w, int64_t n, int64_t k, int64_t sn, int64_t sk, int8_t *out,
                     int threads) {
    int64_t kp = even(k), panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t p = 0; p < panels; p++) {
        int8_t *dst = out + p * kp * PANEL;
        const int8_t *src = w + p * PANEL * sn;
        int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        clear_panel(dst, cols, k);
        int64_t done = 0;
#if defined(__AVX2__)
        if (cols == PANEL && sk == 1) {
            done = 2 * pack_rows(src, k, sn, dst);
        } else if (cols == PANEL && sn == 1) {
            pack_columns(src, k, sk, dst);
            done = k / 2 * 2;
        }
#endif
        pack_scalar(src, done, k, sn, sk, cols, dst);
    }
}

#if defined(__AVX2__)
/* 16 values sw bytes apart from p (sw 1 or 2): one load, or two and their even bytes. */
static inline __m128i strided16(const int8_t *p, int64_t sw) {
    __m128i a = _mm_loadu_si128((const __m128i *)p);
    if (sw == 1) return a;
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    return _mm_unpacklo_epi64(_mm_shuffle_epi8(a, even), _mm_shuffle_epi8(b, even));
}

/* A panel's 16 values of one k: one run of input bytes, or two blended where the panel wraps to
 * the next output row at column s (mask: the lanes from s on). */
static inline __m128i conv_load(const int8_t *at0, const int8_t *at_s, int s, int64_t sw,
                                __m128i mask) {
    __m128i lo = strided16(at0, sw);
    if (s == PANEL) return lo;
    return _mm_blendv_epi8(lo, strided16(at_s - s * sw, sw), mask);
}
#endif

/* Pack the im2col matrix of one sample of a conv of stride (sh, sw), [oh * ow, c * kh * kw]
 * with K in a weight's own order (channel, kernel row, kernel column), straight from the
 * sample's padded input xp ([c, hp, wp] int8, contiguous): the matrix itself is never written.
 * Consecutive output points of a row read input bytes sw apart, so for sw 1 or 2 a full panel
 * takes one strided 16-value load a k, or two where it wraps to the next output row once; xp
 * must have 32 readable bytes before and after it. Other panels (the last, partial one; one over
 * three output rows or more, where ow < 16; any other sw) go value by value. Returns 1 if K's
 * offsets could not be allocated, else 0. */
int asic_int16_pack_conv(const int8_t *xp, int64_t c, int64_t hp, int64_t wp, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh,
                         int64_t ow, int8_t *out, int threads) {
    int64_t n = oh * ow, k = c * kh * kw, kp = even(k), panels = (n + PANEL - 1) / PANEL;
    int64_t *off = malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    if (off == NULL) return 1;
    for (int64_t kk = 0; kk < k; kk++) /* each k's offset from its output point's input byte */
        off[kk] = kk / (kh * kw) * hp * wp + kk / kw % kh * dh * wp + kk % kw * dw;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t p = 0; p < panels; p++) {
        int8_t *dst = out + p * kp * PANEL;
        int64_t first = p * PANEL, cols = n - first < PANEL ? n - first : PANEL;
        int64_t at[PANEL]; /* each column's point: its input byte for k = 0 */
        for (int64_t j = 0; j < cols; j++)
            at[j] = (first + j) / ow * sh * wp + (first + j) % ow * sw;
        int s = (int)cols, runs = 1; /* runs of points sw bytes apart; the second starts at s */
        for (int j = 1; j < cols; j++)
            if (at[j] != at[j - 1] + sw && runs++ == 1) s = j;
        (void)s; /* the vector path's; a build without AVX2 has none */
        clear_panel(dst, cols, k);
#if defined(__AVX2__)
        if (cols == PANEL && runs <= 2 && (sw == 1 || sw == 2)) {
            const int8_t *x0 = xp + at[0], *xs = xp + at[s == PANEL ? 0 : s];
            __m128i mask = _mm_cmpgt_epi8(
                _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm_set1_epi8((char)(s - 1)));
            for (int64_t q = 0; q < kp / 2; q++) {
                int64_t k0 = off[2 * q];
                __m128i r0 = conv_load(x0 + k0, xs + k0, s, sw, mask), r1 = _mm_setzero_si128();
                if (2 * q + 1 < k) {
                    int64_t k1 = off[2 * q + 1];
                    r1 = conv_load(x0 + k1, xs + k1, s, sw, mask);
                }
                store_pair(dst, q, r0, r1);
            }
            continue;
        }
#endif
        for (int64_t j = 0; j < cols; j++)
            for (int64_t kk = 0; kk < k; kk++) *panel_at(dst, j, kk) = xp[at[j] + off[kk]];
    }
    free(off);
    return 0;
}

#if defined(__AVX2__)
/* rows (1 to ROWS, a constant where inlined) x PANEL of out = a16 rows . panel. */
static inline __attribute__((always_inline)) void tile(const int16_t *a16, int64_t kp,
                                                       const int8_t *panel, int rows,
                                                       int32_t *out, int64_t ldo, int64_t cols) {
    __m256i c[ROWS][2];
    for (int r = 0; r < rows; r++) c[r][0] = c[r][1] = _mm256_setzero_si256();
    const int32_t *pairs = (const int32_t *)a16;
    int64_t lda = kp / 2;
    for (int64_t q = 0; q < kp / 2; q++) {
        const int8_t *wq = panel + q * 2 * PANEL;
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wq));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wq + 16)));
        for (int r = 0; r < rows; r++) {
            __m256i b = _mm256_set1_epi32(pairs[r * lda + q]);
            c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(b, w0));
            c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(b, w1));
        }
    }
    for (int r = 0; r < rows; r++) {
        if (cols == PANEL) {
            _mm256_storeu_si256((__m256i *)(out + r * ldo), c[r][0]);
            _mm256_storeu_si256((__m256i *)(out + r * ldo + 8), c[r][1]);
        } else {
            int32_t tmp[PANEL];
            _mm256_storeu_si256((__m256i *)tmp, c[r][0]);
            _mm256_storeu_si256((__m256i *)(tmp + 8), c[r][1]);
            memcpy(out + r * ldo, tmp, (size_t)cols * sizeof(int32_t));
        }
    }
}
#endif

/* out (m x n int32, rows ldo apart) = a16 (m x kp int16, kp = even(k) a row: the activations
 * widened, an odd K's last value anything) . packed^T. Returns 0, or 1 where this build has no
 * kernel. For a caller that widens the activations itself (host_passes.c quantizes straight
 * into them). */
int64_t asic_int16_gemm_a16(const int16_t *a16, int64_t m, int64_t k, const int8_t *packed,
                            int64_t n, int32_t *out, int64_t ldo, int threads) {
#if defined(__AVX2__)
    int64_t kp = even(k), panels = (n + PANEL - 1) / PANEL;
    if (k == 0) { /* an empty sum */
        for (int64_t i = 0; i < m; i++) memset(out + i * ldo, 0, (size_t)n * sizeof(int32_t));
        return 0;
    }
    int64_t group = GROUP_BYTES / (kp * PANEL);
    if (group < 1) group = 1;
    int64_t groups = (panels + group - 1) / group, blocks = (m + ROWS - 1) / ROWS;
    /* Threads share (panel group, block of rows) items: a narrow weight (one group: attention's
     * heads, a small linear) still splits by rows, a decode step's few rows by groups. */
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t g = 0; g < groups; g++) {
        for (int64_t b = 0; b < blocks; b++) {
            int64_t i = b * ROWS, rows = m - i < ROWS ? m - i : ROWS;
            int64_t p_end = (g + 1) * group < panels ? (g + 1) * group : panels;
            for (int64_t p = g * group; p < p_end; p++) {
                int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
                const int16_t *ai = a16 + i * kp;
                const int8_t *wp = packed + p * kp * PANEL;
                int32_t *o = out + i * ldo + p * PANEL;
                switch (rows) {
                case 6: tile(ai, kp, wp, 6, o, ldo, cols); break;
                case 5: tile(ai, kp, wp, 5, o, ldo, cols); break;
                case 4: tile(ai, kp, wp, 4, o, ldo, cols); break;
                case 3: tile(ai, kp, wp, 3, o, ldo, cols); break;
                case 2: tile(ai, kp, wp, 2, o, ldo, cols); break;
                default: tile(ai, kp, wp, 1, o, ldo, cols); break;
                }
            }
        }
    }
    return 0;
#else
    (void)a16, (void)m, (void)k, (void)packed, (void)n, (void)out, (void)ldo, (void)threads;
    return 1;
#endif
}

/* out (m x n int32, rows ldo apart) = a (m x k int8, rows lda apart) . packed^T; a16: the
 * caller's buffer of m * even(k) int16. Returns 0, or 1 where this build has no kernel. */
int64_t asic_int16_gemm(const int8_t *a, int64_t m, int64_t k, int64_t lda, const int8_t *packed,
                        int64_t n, int32_t *out, int64_t ldo, int16_t *a16, int threads) {
#if defined(__AVX2__)
    int64_t kp = even(k);
    /* An odd K's last pair is left as it is: its weight half is 0, so any value multiplies to 0. */
#pragma omp parallel for num_threads(threads) if (threads > 1 && m * kp >= (1 << 16))
    for (int64_t i = 0; i < m; i++)
        for (int64_t kk = 0; kk < k; kk++) a16[i * kp + kk] = a[i * lda + kk];
    return asic_int16_gemm_a16(a16, m, k, packed, n, out, ldo, threads);
#else
    (void)a, (void)m, (void)k, (void)lda, (void)packed, (void)n, (void)out, (void)ldo, (void)a16;
    (void)threads;
    return 1;
#endif
}
