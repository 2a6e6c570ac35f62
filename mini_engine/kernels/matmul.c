/* A linear layer's product, y = x @ W.T in bfloat16, for the few rows a decode step has (the
   engine's kernels "c" and "compiled", through kernels/linear.py; its torch reference is
   F.linear).

   Why it is shaped this way. A decode step's product has a handful of rows against a weight of
   hundreds of thousands of values, so its floor is reading the weight once from memory. On AVX-512
   machines with AVX512_BF16, vdpbf16ps multiplies 16 pairs of bfloat16 values by 16 other pairs
   and adds each pair's two products into one float32 lane. So the weight is packed once into
   blocks of 16 output columns, each block K/2 rows of 16 x 2 values (W[n, k], W[n, k + 1]), in
   the order the loop reads them: one 64-byte load a step. A tile of up to ROWS rows of x by COLS
   blocks keeps ROWS x COLS sums in registers, so each weight load serves every row of the tile
   and each broadcast pair of x serves every block. The threads (OpenMP, on torch's own pool)
   share panels of COLS blocks; a panel stays in the core's cache while the next rows of x pass
   over it, so the weight comes from memory once, and the last group of a panel asks for the next
   panel's weights as it goes (prefetch into L2). A prefill's many rows are cut into groups of
   GROUP_ROWS so that a layer with few panels still gives the threads equal shares. How each
   shape and variant timed: docs/measurements.md.

   The sums are float32, rounded once to bfloat16 at the end (to nearest, ties to even), as oneDNN
   rounds its bfloat16 products; the order of the additions is not oneDNN's, so the last bit of
   an output may differ (tests/engine/test_matmul.py bounds it against float64).

   x        (M, K) bfloat16, rows contiguous, K even
   packed   (ceil(N / 16), K / 2, 16, 2) bfloat16: kernels/linear.py's pack, the columns past N zero
   y        (M, N) bfloat16
   Where the compiler does not target AVX512_BF16, matmul_bf16_supported returns 0 and
   kernels/linear.py does not offer the kernel. */
#include <stdint.h>

#define ROWS 6
#define COLS 4
#define GROUP_ROWS 48      /* rows of a task, at most (above) */

#ifdef __AVX512BF16__
#include <immintrin.h>

/* rows x of x against blocks [block, block + cols) of the packed weight: R and C are constants
   wherever this is inlined, so the sums stay in registers. Where AHEAD (a constant too), the
   next panel's first ahead_cols blocks are asked for (prefetch into L2), a line of each per
   step of K, as the tile reads its own; without, the loop is the same as before there was any. */
static inline __attribute__((always_inline)) void tile(const int R, const int C, const int AHEAD,
        const uint16_t *x, int64_t K, const uint16_t *packed, int64_t block,
        uint16_t *y, int64_t N, const uint16_t *ahead, int ahead_cols) {
    __m512 sum[ROWS][COLS];
    const int32_t *pair[ROWS];              /* (x[r, k], x[r, k + 1]) as one 32-bit value */
    const uint16_t *w[COLS];
    for (int r = 0; r < R; r++) {
        pair[r] = (const int32_t *)(x + r * K);
        for (int c = 0; c < C; c++) sum[r][c] = _mm512_setzero_ps();
    }
    for (int c = 0; c < C; c++) w[c] = packed + (block + c) * K * 16;
    for (int64_t k2 = 0; k2 < K / 2; k2++) {
        __m512i wk[COLS];
        for (int c = 0; c < C; c++) wk[c] = _mm512_loadu_si512(w[c] + k2 * 32);
        for (int c = 0; AHEAD && c < ahead_cols; c++)
            __builtin_prefetch(ahead + c * K * 16 + k2 * 32, 0, 2);
        for (int r = 0; r < R; r++) {
            __m512bh xk = (__m512bh)_mm512_set1_epi32(pair[r][k2]);
            for (int c = 0; c < C; c++)
                sum[r][c] = _mm512_dpbf16_ps(sum[r][c], (__m512bh)wk[c], xk);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            int64_t col = (block + c) * 16;
            __mmask16 keep = N - col >= 16 ? 0xFFFF : (__mmask16)((1u << (N - col)) - 1);
            _mm256_mask_storeu_epi16(y + r * N + col, keep,
                                     (__m256i)_mm512_cvtneps_pbh(sum[r][c]));
        }
}

#define TILE_ROWS(C, A) \
    switch (rows) {  \
    case 1: tile(1, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    case 2: tile(2, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    case 3: tile(3, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    case 4: tile(4, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    case 5: tile(5, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    default: tile(6, C, A, xr, K, packed, block, yr, N, ahead, na); break; \
    }

#define TILE_COLS(A) \
    switch (cols) { \
    case 4: TILE_ROWS(4, A) break; \
    case 3: TILE_ROWS(3, A) break; \
    case 2: TILE_ROWS(2, A) break; \
    default: TILE_ROWS(1, A) break; \
    }

int matmul_bf16_supported(void) { return 1; }

void matmul_bf16(const uint16_t *x, int64_t M, int64_t K, const uint16_t *packed, int64_t N,
                 uint16_t *y) {
    int64_t blocks = (N + 15) / 16, panels = (blocks + COLS - 1) / COLS;
    int64_t groups = (M + GROUP_ROWS - 1) / GROUP_ROWS;
    #pragma omp parallel for schedule(static)
    for (int64_t task = 0; task < panels * groups; task++) {
        int64_t p = task / groups, first = task % groups * GROUP_ROWS;
        int64_t end = first + GROUP_ROWS < M ? first + GROUP_ROWS : M;
        int64_t block = p * COLS, cols = blocks - block < COLS ? blocks - block : COLS;
        /* the next panel, asked for while the last group of this one computes: where that
           group has more than one tile (above) */
        int64_t next = block + COLS;
        int na = end == M && end - first > ROWS && next < blocks
                 ? (int)(blocks - next < COLS ? blocks - next : COLS) : 0;
        const uint16_t *ahead = packed + (na ? next : 0) * K * 16;
        for (int64_t r0 = first; r0 < end; r0 += ROWS) {  /* the panel stays in cache */
            int rows = end - r0 < ROWS ? (int)(end - r0) : ROWS;
            const uint16_t *xr = x + r0 * K;
            uint16_t *yr = y + r0 * N;
            if (na) { TILE_COLS(1) } else { TILE_COLS(0) }
        }
    }
}
#else
int matmul_bf16_supported(void) { return 0; }

void matmul_bf16(const uint16_t *x, int64_t M, int64_t K, const uint16_t *packed, int64_t N,
                 uint16_t *y) {
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)y;
}
#endif
