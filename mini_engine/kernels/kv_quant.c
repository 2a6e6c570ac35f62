/* The 8-bit KV cache's write and read, each in one pass (kernels/kv_quant.py loads this file;
   mini_engine/kv_quant.py is the torch reference it is tested against).

   With torch alone a layer's write is about fourteen small operations (stack, abs, amax, divide,
   clamp, round to bfloat16, divide, clamp, convert, two index copies...) and its read four passes
   with three copies (gather the 8-bit rows, turn them into values, gather their scales,
   multiply). Here each value is touched once: the write quantizes a row's heads straight into
   their slot, and the read turns each byte it gathers into its value, multiplies by its scale
   and rounds once into the output, as vLLM's CPU kernel reads its fp8 pages in place. Both give
   torch's bits exactly (tests/engine/test_kv_quant.py): the same float operations in the same order,
   and torch's own rounding rules (c10's fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value,
   copied below, and bfloat16's round to nearest even).

   A pool's layout (kv_quant.QuantizedPool): values (slots, 2 (K, V), kv_heads, dim) 8-bit codes;
   scales (slots, 2, kv_heads) bfloat16 bits, or NULL for one scale a layer, 1.0. A "group" is
   one of K or V of one KV head: dim values and, with scales, one scale. */
#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* float -> bfloat16, rounded to nearest even, as torch rounds (no NaN reaches here) */
static inline uint16_t to_bf16(float f) {
    uint32_t u = bits_of(f);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static inline float from_bf16(uint16_t h) { return float_of((uint32_t)h << 16); }

/* --- float -> 8 bits: torch's conversions (c10, torch/headeronly/util/Float8_e*.h) ------------
   c10 branches three ways: past the format's range, below its smallest normal (a subnormal,
   rounded by a float add), else the mantissa rounded to nearest even by an integer add. Here all
   three are computed and one is chosen, with no branch, so that the compiler vectorises the
   write; the bits are the same. */
static inline uint8_t to_e4m3(float f) {
    const uint32_t sign = bits_of(f) & 0x80000000u, u = bits_of(f) ^ sign;
    const uint32_t past = u > 0x7F800000u ? 0x7F : 0x7E;          /* NaN, else the largest */
    const uint32_t sub = (bits_of(float_of(u) + float_of(141u << 23)) - (141u << 23)) & 0xFF;
    uint32_t normal = ((u + ((uint32_t)(7 - 127) << 23) + 0x7FFFF + ((u >> 20) & 1)) >> 20) & 0xFF;
    normal = normal == 0x7F ? 0x7E : normal;                        /* a carry into NaN's code */
    const uint32_t r = u >= (1087u << 20) ? past : u < (121u << 23) ? sub : normal;
    return (uint8_t)(r | (sign >> 24));
}

static inline uint8_t to_e5m2(float f) {
    const uint32_t sign = bits_of(f) & 0x80000000u, u = bits_of(f) ^ sign;
    const uint32_t past = u > (255u << 23) ? 0x7F : 0x7C;          /* NaN, else infinity */
    const uint32_t sub = (bits_of(float_of(u) + float_of(134u << 23)) - (134u << 23)) & 0xFF;
    const uint32_t normal =
        ((u + ((uint32_t)(15 - 127) << 23) + 0xFFFFF + ((u >> 21) & 1)) >> 21) & 0xFF;
    const uint32_t r = u >= (143u << 23) ? past : u < (113u << 23) ? sub : normal;
    return (uint8_t)(r | (sign >> 24));
}

/* --- 8 bits -> float, exactly, without a table (so that the compiler can vectorise the read) --
   A code is sign | exponent | mantissa. A normal code's bits, shifted so that its mantissa's top
   meets float's, are a float whose exponent is short by the two formats' bias difference (127 - 7
   for e4m3, 127 - 15 for e5m2): add it. A subnormal's value is its mantissa times the smallest
   subnormal (2^-9, 2^-16), which an int -> float conversion and a multiply give exactly. The
   codes of NaN and infinity are not decoded: a write clamps to the format's range first, so it
   never makes them. */
static inline float from_fp8(uint8_t c, const uint32_t mantissa, const uint32_t bias) {
    const uint32_t mag = c & 0x7Fu, sign = (uint32_t)(c & 0x80u) << 24;
    const uint32_t normal = (mag << (23 - mantissa)) + ((127 - bias) << 23);
    const float smallest = float_of((127 + 1 - bias - mantissa) << 23);  /* 2^-9, 2^-16 */
    const uint32_t subnormal = bits_of((float)mag * smallest);
    const uint32_t is_normal = 0u - (uint32_t)(mag >= (1u << mantissa));  /* no branch */
    return float_of((normal & is_normal) | (subnormal & ~is_normal) | sign);
}

static inline float from_e4m3(uint8_t c) { return from_fp8(c, 3, 7); }
static inline float from_e5m2(uint8_t c) { return from_fp8(c, 2, 15); }

/* Where in slots the first slot outside a pool of num_slots is, or -1 if none. Both functions
   check before they write or read anything and return it, so that a bad slot is an IndexError in
   Python (kv_quant.py), not a write past the pool. */
static int64_t bad_slot(const int64_t *slots, int64_t n, int64_t num_slots) {
    for (int64_t i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= num_slots) return i;
    return -1;
}

/* Enough values to share out among threads; below it, one thread (a decode step's write is a
   few thousand values, and waking a second thread costs more than it saves). */
#define PARALLEL_FROM 32768

/* Write n rows: row i's K (k + i * k_row) and V (v + i * v_row), each (heads, dim) contiguous
   in float or bfloat16 (in_bf16), quantized into slot slots[i]. With scales, each head's K and V
   get their own: the head's largest magnitude / largest (the format's largest value), at least
   1e-12, stored in bfloat16; the values are divided by the scale as stored, clamped to
   +-largest and converted, as kv_quant.QuantizedPool.write_with_torch does. */
int64_t write_kv8(const void *k, int64_t k_row, const void *v, int64_t v_row, int in_bf16,
                  const int64_t *slots, int64_t n, int64_t num_slots, int64_t heads, int64_t dim,
                  uint8_t *values, uint16_t *scales, int e5m2, float largest, int threads) {
    const int64_t bad = bad_slot(slots, n, num_slots);
    if (bad != -1) return bad;
    #pragma omp parallel for num_threads(threads) schedule(static) \
        if (n * 2 * heads * dim >= PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) {
        for (int64_t g = 0; g < 2 * heads; g++) {      /* K's heads, then V's: the pool's order */
            const int64_t h = g % heads, offset = (g < heads ? k_row : v_row) * i + h * dim;
            const void *src = g < heads ? k : v;
            float x[dim];
            for (int64_t d = 0; d < dim; d++)
                x[d] = in_bf16 ? from_bf16(((const uint16_t *)src)[offset + d])
                               : ((const float *)src)[offset + d];
            if (scales) {
                float amax = 0.0f;
                for (int64_t d = 0; d < dim; d++) {
                    const float a = x[d] < 0 ? -x[d] : x[d];
                    amax = a > amax ? a : amax;
                }
                float s = amax / largest;
                if (s < 1e-12f) s = 1e-12f;
                const uint16_t stored = to_bf16(s);
                scales[slots[i] * 2 * heads + g] = stored;
                s = from_bf16(stored);
                for (int64_t d = 0; d < dim; d++) x[d] = x[d] / s;
            }
            uint8_t *dst = values + (slots[i] * 2 * heads + g) * dim;
            for (int64_t d = 0; d < dim; d++) {
                const float c = x[d] > largest ? largest : (x[d] < -largest ? -largest : x[d]);
                dst[d] = e5m2 ? to_e5m2(c) : to_e4m3(c);
            }
        }
    }
    return -1;
}

/* One slot's groups into dst, the loop that runs for every value read: four copies of it, so
   that each is a straight line the compiler vectorises. Inlined with dim a constant (64, every
   model of the lab: see read_kv8) the compiler drops the loop's checks of its length and of
   overlap, which for groups of 64 values cost more than the values themselves. */
static inline __attribute__((always_inline))
void read_slot(const uint8_t *restrict src, const uint16_t *scales, int64_t groups,
               const int64_t dim, int e5m2, int out_bf16, void *restrict dst) {
    for (int64_t g = 0; g < groups; g++) {
        const float s = scales ? from_bf16(scales[g]) : 1.0f;
        const uint8_t *restrict in = src + g * dim;
        if (out_bf16) {
            uint16_t *restrict out = (uint16_t *)dst + g * dim;
            if (e5m2) for (int64_t d = 0; d < dim; d++) out[d] = to_bf16(from_e5m2(in[d]) * s);
            else      for (int64_t d = 0; d < dim; d++) out[d] = to_bf16(from_e4m3(in[d]) * s);
        } else {
            float *restrict out = (float *)dst + g * dim;
            if (e5m2) for (int64_t d = 0; d < dim; d++) out[d] = from_e5m2(in[d]) * s;
            else      for (int64_t d = 0; d < dim; d++) out[d] = from_e4m3(in[d]) * s;
        }
    }
}

/* Read n slots into out (n, groups, dim), bfloat16 (out_bf16) or float: each value is its code's
   value times its group's scale, rounded once. */
int64_t read_kv8(const uint8_t *values, const uint16_t *scales, const int64_t *slots, int64_t n,
                 int64_t num_slots, int64_t groups, int64_t dim, int e5m2, int out_bf16,
                 void *out, int threads) {
    const int64_t bad = bad_slot(slots, n, num_slots);
    if (bad != -1) return bad;
    const int64_t row = groups * dim, width = out_bf16 ? 2 : 4;
    #pragma omp parallel for num_threads(threads) schedule(static) \
        if (n * row >= PARALLEL_FROM)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = values + slots[i] * row;
        const uint16_t *s = scales ? scales + slots[i] * groups : NULL;
        char *dst = (char *)out + i * row * width;
        if (dim == 64) read_slot(src, s, groups, 64, e5m2, out_bf16, dst);
        else           read_slot(src, s, groups, dim, e5m2, out_bf16, dst);
    }
    return -1;
}
