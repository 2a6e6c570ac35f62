/* The 8-bit KV cache's read in one pass (task 14; mini_engine/kv_quant.py builds and loads it).

   Attention needs a request's context back in the model's dtype. With torch alone that is four
   passes and three copies: index_select gathers the 8-bit rows, a table turns them into values,
   a second gather fetches their scales, a multiply applies them. Here each byte is read once,
   from its slot, turned into its value through a table of the format's 256 values (exact: built
   by torch's own conversion), multiplied by its scale, and rounded once into the output, as
   vLLM's CPU kernel reads its fp8 pages in place. The result is bit for bit torch's
   (tests/test_kv_quant.py): the same products in float, rounded to bfloat16 the same way.

   values  (slots, groups, dim) 8-bit codes; a group is one of K or V of one KV head
   scales  (slots, groups) bfloat16 bits, or NULL: one scale a layer, 1.0
   slots   (n,) the slots to read, in order
   lut     (256,) float: the value of each code
   out     (n, groups, dim) bfloat16 (out_bf16) or float */
#include <stdint.h>
#include <string.h>

/* float -> bfloat16, rounded to nearest even, as torch rounds (no NaN ever reaches here: writes
   clamp to the format's range) */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void read_kv8(const uint8_t *values, const uint16_t *scales, const int64_t *slots, int64_t n,
              int64_t groups, int64_t dim, const float *lut, int out_bf16, void *out,
              int threads) {
    /* the slots are shared out among torch's threads: each writes its own rows */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = values + slots[i] * groups * dim;
        for (int64_t g = 0; g < groups; g++) {
            const float s = scales ? from_bf16(scales[slots[i] * groups + g]) : 1.0f;
            const uint8_t *src = row + g * dim;
            const int64_t o = (i * groups + g) * dim;
            if (out_bf16) {
                uint16_t *dst = (uint16_t *)out + o;
                for (int64_t d = 0; d < dim; d++) dst[d] = to_bf16(lut[src[d]] * s);
            } else {
                float *dst = (float *)out + o;
                for (int64_t d = 0; d < dim; d++) dst[d] = lut[src[d]] * s;
            }
        }
    }
}
