/* The amx host kernel of asic_backend.sim.host_gemm: the DUT's int8 x int8 -> int32 GEMM,
 * exactly, on Intel AMX's tile unit (TDPBSSD: signed int8 products summed into int32 tiles).
 *
 * oneDNN's torch._int_mm (its gemm API) packs its operands on every call and writes its int32
 * product through memory: this kernel multiplies a weight packed once, and hands each
 * 32 x 32 block of the product, while it is in L1, to a sink (a copy into the caller's int32
 * output, or the dynamic linear's rescale in host_passes.c). Sums of K <= INT_MM_MAX_K
 * products of int8 values never leave int32, so the result is exact in any order.
 *
 * Packing (asic_amx_pack): panels of PANEL columns; in each, K in blocks of TILE_K, each block
 * two B tiles of 16 columns: TILE_ROWS rows of 4 consecutive K values of each of the 16 columns
 * (the "VNNI" layout TDPBSSD reads). K is padded to TILE_K and the columns to PANEL with zeros.
 * The activations are copied (or quantized, by host_passes.c) into rows of amx_lda(k) bytes,
 * padded with zeros to a multiple of TILE_ROWS rows: a row stride off a power of two, so the 16
 * rows a tile load reads do not fall into one set of L1.
 *
 * OpenMP threads share (group of panels, span of rows) pairs; each thread configures its tiles
 * and releases them. Linux grants a process the tile state on request (asic_amx_available, asked
 * at the kernel's first use, not at the library's load: a process granted it needs larger
 * signal stacks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define ASIC_AMX 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define TILE_ROWS 16
#define TILE_K 64 /* int8 values of K a tile row holds: 64 bytes */
#define PANEL 32  /* columns of a panel: two accumulator tiles of 16 int32 */
#define BLOCK_ROWS 32
/* K tiles a chunk of K at most, and the packed bytes of a chunk of a group of panels: in L2. */
#define CHUNK_TILES 32
#define GROUP_BYTES (512 * 1024)
/* A thread's int32 sums of the blocks of a span of rows by a group, while K is summed chunk by
 * chunk: in L2 too. */
#define SPAN_BYTES (512 * 1024)

static inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* The row stride of the activations' buffer: K padded to TILE_K, plus one cache line. */
int64_t asic_amx_lda(int64_t k) { return round_up(k, TILE_K) + 64; }

/* Bytes of the activations' buffer of m rows. */
int64_t asic_amx_a_bytes(int64_t m, int64_t k) {
    return round_up(m, TILE_ROWS) * asic_amx_lda(k);
}

/* Bytes of a packed [n, k] weight. */
int64_t asic_amx_packed_bytes(int64_t n, int64_t k) {
    return round_up(n, PANEL) * round_up(k, TILE_K);
}

/* Where a packing holds column j's value of k = kk. */
static inline int64_t packed_at(int64_t j, int64_t kk, int64_t kp) {
    return (j / PANEL) * kp * PANEL + (kk / TILE_K) * PANEL * TILE_K +
           ((j % PANEL) / 16) * 16 * TILE_K + ((kk % TILE_K) / 4) * 64 + (j % 16) * 4 + kk % 4;
}

/* Pack w [n, k] (element (j, kk) at w[j * sn + kk * sk]) into dst (asic_amx_packed_bytes). */
void asic_amx_pack(const int8_t *w, int64_t n, int64_t k, int64_t sn, int64_t sk, int8_t *dst,
                   int threads) {
    const int64_t kp = round_up(k, TILE_K), panels = round_up(n, PANEL) / PANEL;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t p = 0; p < panels; p++) {
        int8_t *panel = dst + p * kp * PANEL;
        const int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        if (cols < PANEL || kp != k) memset(panel, 0, (size_t)(kp * PANEL));
        for (int64_t c = 0; c < cols; c++) {
            const int64_t j = p * PANEL + c;
            const int8_t *row = w + j * sn;
            if (sk == 1) { /* a row's 4 consecutive values at a time */
                int64_t kk = 0;
                for (; kk + 4 <= k; kk += 4) memcpy(dst + packed_at(j, kk, kp), row + kk, 4);
                for (; kk < k; kk++) dst[packed_at(j, kk, kp)] = row[kk];
            } else {
                for (int64_t kk = 0; kk < k; kk++) dst[packed_at(j, kk, kp)] = row[kk * sk];
            }
        }
    }
}

/* Where a block of the product goes: its rows i0 to i0 + rows and columns j0 to j0 + cols of the
 * product, its int32 values in rows ld apart (the rest of the block's 32 x 32 is padding). */
typedef void (*asic_amx_sink)(void *ctx, const int32_t *block, int64_t ld, int64_t i0,
                              int64_t rows, int64_t j0, int64_t cols);

int asic_amx_available(void);

/* 1 if this build has the kernel (the compiler targets AMX, on Linux), else 0. */
int asic_amx_built(void) {
#ifdef ASIC_AMX
    return 1;
#else
    return 0;
#endif
}

#ifdef ASIC_AMX
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Every tile 16 rows of 64 bytes: 0-3 accumulators, 4-5 activations, 6-7 weights. */
static void configure(void) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = TILE_ROWS;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* 32 rows x one panel over the K tiles q0 to q1: the accumulators start from acc (BLOCK_ROWS x
 * PANEL int32) where from_acc, else from zero, and end in dst (the same layout). */
static inline void block_32(const int8_t *a, int64_t lda, const int8_t *b, int64_t q0, int64_t q1,
                            const int32_t *acc, int from_acc, int32_t *dst) {
    if (from_acc) {
        _tile_loadd(0, acc, PANEL * 4);
        _tile_loadd(1, acc + 16, PANEL * 4);
        _tile_loadd(2, acc + 16 * PANEL, PANEL * 4);
        _tile_loadd(3, acc + 16 * PANEL + 16, PANEL * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t q = q0; q < q1; q++) {
        _tile_loadd(4, a + q * TILE_K, lda);
        _tile_loadd(5, a + TILE_ROWS * lda + q * TILE_K, lda);
        _tile_loadd(6, b + q * PANEL * TILE_K, 64);
        _tile_loadd(7, b + q * PANEL * TILE_K + 16 * TILE_K, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, dst, PANEL * 4);
    _tile_stored(1, dst + 16, PANEL * 4);
    _tile_stored(2, dst + 16 * PANEL, PANEL * 4);
    _tile_stored(3, dst + 16 * PANEL + 16, PANEL * 4);
}

/* 16 rows x one panel, as block_32. */
static inline void block_16(const int8_t *a, int64_t lda, const int8_t *b, int64_t q0, int64_t q1,
                            const int32_t *acc, int from_acc, int32_t *dst) {
    if (from_acc) {
        _tile_loadd(0, acc, PANEL * 4);
        _tile_loadd(1, acc + 16, PANEL * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
    }
    for (int64_t q = q0; q < q1; q++) {
        _tile_loadd(4, a + q * TILE_K, lda);
        _tile_loadd(6, b + q * PANEL * TILE_K, 64);
        _tile_loadd(7, b + q * PANEL * TILE_K + 16 * TILE_K, 64);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
    }
    _tile_stored(0, dst, PANEL * 4);
    _tile_stored(1, dst + 16, PANEL * 4);
}

/* 1 if this process may use AMX's tiles, asking Linux for them the first time. */
int asic_amx_available(void) {
    static int state = -1; /* asked once: the grant holds for the process */
    if (state < 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return state;
}

/* The product of a (m rows of asic_amx_lda(k) bytes, padded as the header says) by the packed
 * weight [n, k], each block handed to sink once it is whole. Loops as GotoBLAS nests them: for
 * each group of panels (a chunk of K of them in L2) and each span of rows, K chunk by chunk, the
 * blocks of the span and the group; a block's int32 sums over the chunks so far wait in this
 * thread's buffer (SPAN_BYTES), so each chunk of the weight is read from L2 for every block of
 * rows, and the activations once a group. */
int asic_amx_gemm_sink(const int8_t *a, int64_t m, int64_t k, const int8_t *packed, int64_t n,
                       asic_amx_sink sink, void *ctx, int threads) {
    if (m <= 0 || n <= 0) return 0; /* no block */
    const int64_t lda = asic_amx_lda(k), kp = round_up(k, TILE_K), kb = kp / TILE_K;
    /* K tiles a chunk; one, of none, for K = 0, whose blocks are zeros. */
    const int64_t chunk = kb < 1 ? 1 : kb < CHUNK_TILES ? kb : CHUNK_TILES;
    const int64_t panels = round_up(n, PANEL) / PANEL;
    int64_t group = GROUP_BYTES / (chunk * TILE_K * PANEL);
    group = group < 1 ? 1 : group > panels ? panels : group;
    const int64_t groups = (panels + group - 1) / group;
    const int64_t blocks = (round_up(m, TILE_ROWS) + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int chunked = kb > chunk;
    /* Blocks of rows a span: one where K is one chunk (no sums wait); else as many as the sums'
     * buffer holds, but few enough that every thread has a (group, span) pair. */
    int64_t span = chunked ? SPAN_BYTES / (group * BLOCK_ROWS * PANEL * 4) : 1;
    const int64_t spans_wanted = (threads + groups - 1) / groups;
    const int64_t most = (blocks + spans_wanted - 1) / spans_wanted;
    span = span > most ? most : span;
    span = span < 1 ? 1 : span;
    const int64_t spans = (blocks + span - 1) / span;
    const int64_t sums_each = chunked ? span * group * BLOCK_ROWS * PANEL : 0;
    int32_t *sums_all = 0;
    if (chunked && !(sums_all = aligned_alloc(64, (size_t)(threads * sums_each * 4)))) return -2;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int32_t c[BLOCK_ROWS * PANEL] __attribute__((aligned(64)));
#ifdef _OPENMP
        int32_t *sums = sums_all + (int64_t)omp_get_thread_num() * sums_each;
#else
        int32_t *sums = sums_all;
#endif
        configure();
#pragma omp for collapse(2) schedule(static)
        for (int64_t g = 0; g < groups; g++)
            for (int64_t s = 0; s < spans; s++) {
                const int64_t p0 = g * group, p1 = p0 + group < panels ? p0 + group : panels;
                const int64_t r0 = s * span, r1 = r0 + span < blocks ? r0 + span : blocks;
                for (int64_t q0 = 0; q0 < kb || q0 == 0; q0 += chunk) {
                    const int64_t q1 = q0 + chunk < kb ? q0 + chunk : kb;
                    const int last = q1 == kb;
                    for (int64_t r = r0; r < r1; r++) {
                        const int64_t i0 = r * BLOCK_ROWS;
                        const int64_t rows = m - i0 < BLOCK_ROWS ? m - i0 : BLOCK_ROWS;
                        for (int64_t p = p0; p < p1; p++) {
                            const int64_t slot = ((r - r0) * group + (p - p0)) * BLOCK_ROWS * PANEL;
                            int32_t *acc = chunked ? sums + slot : c;
                            int32_t *dst = last ? c : acc;
                            const int8_t *b = packed + p * kp * PANEL;
                            if (rows > TILE_ROWS)
                                block_32(a + i0 * lda, lda, b, q0, q1, acc, q0 > 0, dst);
                            else
                                block_16(a + i0 * lda, lda, b, q0, q1, acc, q0 > 0, dst);
                            if (last) {
                                const int64_t j0 = p * PANEL;
                                sink(ctx, c, PANEL, i0, rows, j0, n - j0 < PANEL ? n - j0 : PANEL);
                            }
                        }
                    }
                }
            }
        _tile_release();
    }
    free(sums_all);
    return 0;
}
#else
int asic_amx_available(void) { return 0; }

int asic_amx_gemm_sink(const int8_t *a, int64_t m, int64_t k, const int8_t *packed, int64_t n,
                       asic_amx_sink sink, void *ctx, int threads) {
    (void)a, (void)m, (void)k, (void)packed, (void)n, (void)sink, (void)ctx, (void)threads;
    return -1;
}
#endif

/* Copy m rows of a (element (i, kk) at a[i * sa + kk], K values) into buf, padded. */
static void copy_a(const int8_t *a, int64_t m, int64_t k, int64_t sa, int8_t *buf) {
    const int64_t lda = asic_amx_lda(k), mp = round_up(m, TILE_ROWS);
    for (int64_t i = 0; i < m; i++) {
        memcpy(buf + i * lda, a + i * sa, (size_t)k);
        memset(buf + i * lda + k, 0, (size_t)(lda - k));
    }
    memset(buf + m * lda, 0, (size_t)((mp - m) * lda));
}

struct copy_out {
    int32_t *out;
    int64_t ldo;
};

static void copy_block(void *ctx, const int32_t *block, int64_t ld, int64_t i0, int64_t rows,
                       int64_t j0, int64_t cols) {
    const struct copy_out *o = ctx;
    for (int64_t i = 0; i < rows; i++)
        memcpy(o->out + (i0 + i) * o->ldo + j0, block + i * ld, (size_t)cols * sizeof(int32_t));
}

/* out [m, n] (rows ldo apart) = a [m, k] (rows sa apart) by the packed weight [n, k], through
 * buf (asic_amx_a_bytes). Returns 0, -1 where the build or the process has no AMX, -2 where
 * the sums of a long K found no memory. */
int64_t asic_amx_gemm(const int8_t *a, int64_t m, int64_t k, int64_t sa, const int8_t *packed,
                      int64_t n, int32_t *out, int64_t ldo, int8_t *buf, int threads) {
    if (!asic_amx_available()) return -1;
    copy_a(a, m, k, sa, buf);
    struct copy_out o = {out, ldo};
    return asic_amx_gemm_sink(buf, m, k, packed, n, copy_block, &o, threads);
}
