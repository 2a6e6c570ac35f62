/* Attention that reads the pages where they are (kernels/attention.py loads this file for every
   row of a step, a decode's one query and a prefill's many alike; its torch reference is
   Llama.attention's gather and SDPA in mini_engine/model.py).

   The torch way is a gather: every context position's K and V copied from its page into a new
   tensor, the contexts of a call padded to its longest, then SDPA over the copy with a mask for
   the padding and for what a prefill's query must not see. Here each row of the step is one
   query against its own request's context up to its own position (so a prefill is causal by its
   lengths, not by a mask): a task (a row, on one of torch's threads) walks that context in
   blocks of 16 positions, through its request's slots, and for each KV head: scores the 16 keys
   against the query heads that share the head, keeps a running softmax (its maximum and total
   so far, the sum so far rescaled when the maximum grows: "online softmax", as flash attention
   and vLLM's kernels do), and adds in the 16 V rows with their weights. Nothing is copied,
   padded or masked, so a request of 20 tokens costs 20 tokens beside one of 1,000.

   Reading scattered pages is half the work, so each key a head scores asks for the same head's
   K and V rows one block ahead, into L2 (prefetch), spread one slot at a time over the block.
   Where the head's shape is SmolLM's (3 query heads a KV head, 64 values a head) in bfloat16,
   head_block is compiled with those numbers as constants, so the compiler unrolls its loops and
   keeps a block's sums in registers; any other shape runs the same code with them as variables.
   How each choice timed: docs/measurements.md.

   The vectors are the compiler's (GCC and Clang vector extensions, 16 floats: one AVX-512
   register, two AVX2 ones), not one instruction set's intrinsics. A dot product of a key with a
   query is 4 x 16 partial sums; sixteen of them, one a position, are summed across lanes together
   (transpose_sum), which costs about one instruction a position instead of a tree each.

   The arithmetic is float32 throughout, whatever the pool's dtype (float32 or bfloat16), and the
   output is rounded once to the model's dtype. Its order of additions is not SDPA's, so its
   outputs may differ from SDPA's in their last bits (tests/engine/test_paged_attention.py bounds
   it). A request is computed the same way whatever else is in the batch: its tokens do not depend
   on its neighbours.

   q        (rows, heads, dim) float32 or bfloat16 (in_bf16), a row every q_row values
   rows     (n,) the rows of q that attend, one query each
   req      (n,) the request of each: its row of slots
   pool     (slots, 2 (K, V), kv_heads, dim), the dtype of q
   slots    (requests, max_len) each request's context, position by position
   lens     (n,) how far each row attends: positions [0, lens[i]) of its request's context
   out      (n, heads * dim), the dtype of q, heads in the model's order (KV head by KV head)
   Limits, checked by kernels/attention.py before it calls: dim a multiple of 16 and at most 128,
   at most 8 query heads a KV head and 16 KV heads. */
#include <stdint.h>
#include <string.h>

#define AHEAD 1             /* blocks ahead that a block asks for (above) */

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
#define LANES 16

/* 16 values of a row, as floats (bfloat16 is float's top half) */
static inline v16 load16(const void *src, int bf16) {
    v16 r;
    if (bf16) {
        u16x16 h;
        memcpy(&h, src, sizeof h);
        u32x16 w = __builtin_convertvector(h, u32x16) << 16;
        memcpy(&r, &w, sizeof r);
    } else {
        memcpy(&r, src, sizeof r);
    }
    return r;
}

static inline v16 splat(float x) { return (v16){x,x,x,x,x,x,x,x,x,x,x,x,x,x,x,x}; }

static inline float hsum(v16 x) {       /* a vector's lanes added, halves first */
    v8 a, b; memcpy(&a, &x, 32); memcpy(&b, (char *)&x + 32, 32); a += b;
    v4 c, d; memcpy(&c, &a, 16); memcpy(&d, (char *)&a + 16, 16); c += d;
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static inline float hmax(v16 x) {
    float m = x[0];
    for (int l = 1; l < LANES; l++) m = x[l] > m ? x[l] : m;
    return m;
}

#if defined(__clang__)              /* two vectors' lanes picked by index, 0-31 */
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF(a, b, ...) __builtin_shuffle(a, b, (i32x16){__VA_ARGS__})
#endif
/* p[0..15], each 16 partial sums -> one v16 whose lane i is the sum of p[i]: at each level two
   vectors holding w partials of k sums each become one holding w/2 partials of 2k sums. */
static inline v16 transpose_sum(const v16 *p) {
    v16 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++)   /* 8 partials each of sums 2i, 2i+1 */
        a[i] = SHUF(p[2 * i], p[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7,
                    16, 17, 18, 19, 20, 21, 22, 23)
             + SHUF(p[2 * i], p[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15,
                    24, 25, 26, 27, 28, 29, 30, 31);
    for (int i = 0; i < 4; i++)   /* 4 each of sums 4i .. 4i+3 */
        b[i] = SHUF(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11,
                    16, 17, 18, 19, 24, 25, 26, 27)
             + SHUF(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15,
                    20, 21, 22, 23, 28, 29, 30, 31);
    for (int i = 0; i < 2; i++)   /* 2 each of sums 8i .. 8i+7 */
        c[i] = SHUF(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13,
                    16, 17, 20, 21, 24, 25, 28, 29)
             + SHUF(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15,
                    18, 19, 22, 23, 26, 27, 30, 31);
    return SHUF(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + SHUF(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

static inline v16 pick(i32x16 mask, v16 yes, v16 no) {   /* lane by lane, no branch */
    i32x16 a, b; memcpy(&a, &yes, 64); memcpy(&b, &no, 64);
    i32x16 r = (mask & a) | (~mask & b);
    v16 out; memcpy(&out, &r, 64); return out;
}

/* e^x for x <= 0 (scores less their maximum), within about 2 ulp: x = n ln2 + r, |r| <= ln2/2,
   e^r by Cephes' polynomial, 2^n put into the exponent's bits; 0 below -87, where e^x is under
   float's smallest normal. No libm call, so it stays in vectors. */
static inline v16 exp_neg16(v16 x) {
    const v16 lo = splat(-87.0f);
    i32x16 under = x < lo;
    v16 c = pick(under, lo, x);
    v16 n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    v16 r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
    v16 p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r
              + 4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * r * r
            + r + 1.0f;
    i32x16 ni = __builtin_convertvector(n, i32x16);
    i32x16 bits = (ni + 127) << 23;
    v16 two; memcpy(&two, &bits, 64);
    v16 res = p * two;
    return pick(under, splat(0.0f), res);
}

static inline uint16_t to_bf16(float f) {     /* rounded to nearest even, as torch rounds */
    uint32_t u; memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

#define MAX_G 8             /* query heads a KV head serves (SmolLM: 3) */
#define MAX_CHUNKS 8        /* head_dim / 16 (SmolLM: 4) */
#define MAX_KV_HEADS 16     /* (SmolLM: 3) */

/* One KV head of one request: its query heads, and the online softmax's running state. */
typedef struct {
    v16 query[MAX_G][MAX_CHUNKS], acc[MAX_G][MAX_CHUNKS];
    float top[MAX_G], total[MAX_G];
} Head;

typedef struct {
    const char *pool;
    int64_t slot_bytes, group, chunks, kv_heads;
    int bf16;
} Shape;

/* One block of up to 16 context positions (sl[0..m)) for one KV head h: scores, the softmax's
   running maximum and total brought up to date, the V rows added in; meanwhile the head's K and
   V rows of the slots ahead[0..am) are asked for (prefetch into L2). */
static inline __attribute__((always_inline)) void head_block(Head *hd, const Shape *t,
        const int64_t G, const int64_t CH, const int bf16, int64_t h, const int64_t *sl,
        int64_t m, const int64_t *ahead, int64_t am) {
    const int64_t width = bf16 ? 2 : 4;
    const int64_t k_off = h * CH * LANES * width, v_off = (t->kv_heads + h) * CH * LANES * width;
    v16 s[MAX_G], parts[MAX_G][LANES], acc[MAX_G][MAX_CHUNKS];
    for (int64_t jj = 0; jj < LANES; jj++) {
        v16 k[MAX_CHUNKS];
        const char *row = t->pool + sl[jj < m ? jj : 0] * t->slot_bytes + k_off;
        if (jj < am) {
            const char *next = t->pool + ahead[jj] * t->slot_bytes;
            for (int64_t b = 0; b < CH * LANES * width; b += 64) {
                __builtin_prefetch(next + k_off + b, 0, 2);
                __builtin_prefetch(next + v_off + b, 0, 2);
            }
        }
        for (int64_t c = 0; c < CH; c++) k[c] = load16(row + c * LANES * width, bf16);
        for (int64_t g = 0; g < G; g++) {
            v16 a = hd->query[g][0] * k[0];
            for (int64_t c = 1; c < CH; c++) a += hd->query[g][c] * k[c];
            parts[g][jj] = a;
        }
    }
    for (int64_t g = 0; g < G; g++) {
        s[g] = transpose_sum(parts[g]);
        for (int64_t jj = m; jj < LANES; jj++) s[g][jj] = -3.0e38f;   /* past the context */
        const float block_top = hmax(s[g]), top = block_top > hd->top[g] ? block_top : hd->top[g];
        const float fix = exp_neg16(splat(hd->top[g] - top))[0];   /* the old terms, rescaled */
        for (int64_t c = 0; c < CH; c++) acc[g][c] = hd->acc[g][c] * fix;
        s[g] = exp_neg16(s[g] - top);
        hd->total[g] = hd->total[g] * fix + hsum(s[g]);
        hd->top[g] = top;
    }
    for (int64_t jj = 0; jj < m; jj++) {        /* the sums in registers, stored once a block */
        const char *row = t->pool + sl[jj] * t->slot_bytes + v_off;
        for (int64_t c = 0; c < CH; c++) {
            const v16 v = load16(row + c * LANES * width, bf16);
            for (int64_t g = 0; g < G; g++) acc[g][c] += s[g][jj] * v;
        }
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t c = 0; c < CH; c++) hd->acc[g][c] = acc[g][c];
}

void paged_attention(const void *q, int64_t q_row, const int64_t *rows, const int64_t *req,
                     const void *pool, const int64_t *slots, int64_t max_len, const int64_t *lens,
                     int64_t n, int64_t kv_heads, int64_t group, int64_t dim, float scale,
                     int in_bf16, void *out, int threads) {
    const int64_t width = in_bf16 ? 2 : 4;
    const Shape t = {(const char *)pool, 2 * kv_heads * dim * width, group, dim / LANES, kv_heads,
                     in_bf16};
    /* a task is a row, all its KV heads: each slot's row is read whole, block by block. With
       fewer rows than threads, a task is one KV head of a row instead. */
    const int64_t per = n >= threads ? kv_heads : 1, tasks = n * (kv_heads / per);
    #pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t i = task / (kv_heads / per), h0 = task % (kv_heads / per) * per;
        const int64_t len = lens[i], *sl = slots + req[i] * max_len;
        Head hd[MAX_KV_HEADS];
        for (int64_t h = h0; h < h0 + per; h++) {
            const char *qrow = (const char *)q + (rows[i] * q_row + h * group * dim) * width;
            for (int64_t g = 0; g < group; g++) {
                for (int64_t c = 0; c < t.chunks; c++) {
                    hd[h - h0].query[g][c] =
                        load16(qrow + (g * dim + c * LANES) * width, in_bf16) * scale;
                    hd[h - h0].acc[g][c] = splat(0.0f);
                }
                hd[h - h0].top[g] = -3.0e38f;
                hd[h - h0].total[g] = 0.0f;
            }
        }
        for (int64_t j0 = 0; j0 < len; j0 += LANES) {
            /* the slots whose rows this block asks for: AHEAD blocks on (above) */
            const int64_t a0 = j0 + AHEAD * LANES;
            const int64_t am = len - a0 < 0 ? 0 : (len - a0 < LANES ? len - a0 : LANES);
            const int64_t *ahead = am ? sl + a0 : sl;
            const int64_t m = len - j0 < LANES ? len - j0 : LANES;
            for (int64_t h = h0; h < h0 + per; h++) {
                if (t.bf16 && t.group == 3 && t.chunks == 4)  /* SmolLM's, bf16: unrolled */
                    head_block(&hd[h - h0], &t, 3, 4, 1, h, sl + j0, m, ahead, am);
                else
                    head_block(&hd[h - h0], &t, t.group, t.chunks, t.bf16, h, sl + j0, m, ahead,
                               am);
            }
        }
        for (int64_t h = h0; h < h0 + per; h++) {
            const int64_t o = (i * kv_heads + h) * group * dim;
            for (int64_t g = 0; g < group; g++)
                for (int64_t c = 0; c < t.chunks; c++) {
                    const v16 value = hd[h - h0].acc[g][c] / hd[h - h0].total[g];
                    for (int l = 0; l < LANES; l++) {
                        const int64_t at = o + g * dim + c * LANES + l;
                        if (in_bf16) ((uint16_t *)out)[at] = to_bf16(value[l]);
                        else ((float *)out)[at] = value[l];
                    }
                }
        }
    }
}
