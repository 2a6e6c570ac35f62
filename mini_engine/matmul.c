/* The linear layers' product for a decode step, y = x @ W.T in bfloat16, for the few rows a step
   has (task 13; mini_engine/linear.py offers it as one more candidate, "mini_engine C", and the
   warm-up keeps it only where it measures fastest on this CPU).

   Why one more kernel. A decode step's product has a handful of rows (1 to the engine's cap, 16)
   against a weight of hundreds of thousands of values: the weight is read once from memory and
   each value is used for a handful of rows. Its floor is the time to read the weights (one read
   of SmolLM-135M's 269 MB, docs/roofline.md), and at 16 rows the multiplications' time at peak is
   about as long. oneDNN, the library behind F.linear, is built for products with many rows too:
   on an AMD EPYC with AVX-512 it read its packed weights at about half the machine's memory
   speed at one row, where this kernel reads them at nearly all of it (docs/measurements.md).

   How. vdpbf16ps (AVX512_BF16, on AMD Zen 4 and Intel Cooper Lake and later) multiplies 16 pairs
   of bfloat16 values by 16 other pairs and adds each pair's two products into one float32 lane:
   16 outputs each advance by two steps of K in one instruction. So the weight is packed once, at
   the warm-up, into blocks of 16 output columns, each block K/2 rows of 16 x 2 values: (W[n, k],
   W[n, k + 1]) for n in the block, k = 0, 2, 4, ..., one 64-byte load per step, in the order the
   loop reads them. A tile of up to ROWS rows of x by COLS blocks (64 columns) keeps ROWS x COLS
   sums in registers; each weight load serves every row of the tile, and each pair of x values,
   one 4-byte broadcast, serves every block. The two threads share the panels of COLS blocks
   (OpenMP, on torch's own pool, as paged_attention.c). A panel's K/2 x 128 values (72 KB at
   K = 576) stay in the core's cache while the next rows of x pass over them, so the weight
   comes from memory once. A prefill's hundreds of rows are also cut into groups of GROUP_ROWS,
   a task being one panel's group: where a layer has few panels (9 at N = 576) the threads then
   get equal shares. On the decoder layers at 1,024 rows the C took 1.00-1.03x oneDNN's time
   with panels alone, 0.94-0.95x with groups of 48, 0.97x with groups of 96; 24 and 36 came
   within a per cent of 48 (docs/measurements.md). A decode step's rows are one group, as
   before.

   A group of more than one tile (7 or more rows) reads its panel from memory in its first tile
   and from the core's cache in the next ones, where memory would sit idle; so the last group of
   a panel asks for the next panel's weights as it goes, one line of each block per step of K
   (prefetch into L2). All the decoder layers and the LM head, the best of seven passes taken in
   turns, ms: 8 rows 9.7 -> 9.0, 12 12.0 -> 10.4, 16 14.7 -> 12.5; 1 and 2 rows unchanged (8.2,
   8.6), where one tile is the weights' read itself and asking ahead in every tile made one row
   3 % slower. At 1,024 rows this build took 648-678 ms against 626-644 before, but a build of
   it that never asks ahead took as long (656, 660): that difference is the build's, not the
   asking (docs/measurements.md).
   ROWS 6 and COLS 4 came out best of seven shapes tried on that EPYC (6 x 4 sums, 24 of the 32
   vector registers).

   The sums are float32, rounded once to bfloat16 at the end (to nearest, ties to even), as oneDNN
   rounds its bfloat16 products; the order of the additions is not oneDNN's, so the last bit of
   an output may differ (tests/test_matmul.py bounds it against float64).

   x        (M, K) bfloat16, rows contiguous, K even
   packed   (ceil(N / 16), K / 2, 16, 2) bfloat16: matmul_pack's layout, the columns past N zero
   y        (M, N) bfloat16
   Where the compiler does not target AVX512_BF16 (-march=native on a CPU without it),
   matmul_bf16_supported returns 0 and linear.py does not offer the kernel. */
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
