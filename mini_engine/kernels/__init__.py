"""What makes mini_engine's step fast on a CPU, apart from the engine that teaches the mechanisms.

The engine one level up runs in plain torch on any CPU. These are what it takes instead where they
build, through one setting, EngineConfig.kernels:

    "torch"     nothing from here: gather + SDPA, F.linear, the 8-bit cache through torch
    "c"         the C below, each where it builds and takes the model, else its torch way
    "compiled"  "c", and the decoder layers compiled into one graph by torch.compile

    build.py             builds a C file for this machine once (gcc -O3 -march=native), loads it
    attention.py         paged_attention.c: attention reading the pages in place
    kv_quant.py          kv_quant.c: the 8-bit cache's write and read, one pass each
    linear.py            matmul.c: a linear layer's product for a step's few rows (bfloat16 on
                         CPUs with AVX512_BF16)
    compiled.py          the forward compiled with inductor, the products and attention inside it

Each C file sits beside its wrapper, and each wrapper names the torch way it is tested against.
What each buys in a decode step is task 13's part 1 and part 4 (docs/measurements.md).
"""



def take(engine) -> None:
    """What EngineConfig.kernels asks of the engine, each part where it builds and takes the
    model: the faster packed product (timed at batch 1 and the cap, once a model), the C
    attention over the model's own pools, the C 8-bit pool, and with "compiled" the forward as
    one graph. Where a part cannot run, the engine keeps its torch way for it."""
    from mini_engine.kernels.attention import in_place_groups, takes
    from mini_engine.kernels.kv_quant import CQuantizedPool, available
    from mini_engine.kernels.linear import for_model
    m, config = engine.model, engine.config
    engine.products = for_model(m, tuple(sorted({1, config.max_batch})))
    engine.linear = engine.products.linear
    if config.kv_cache_dtype == "auto" and takes(m.dtype, m.num_heads, m.num_kv_heads,
                                                 m.head_dim):
        engine.in_place = in_place_groups               # an 8-bit pool is read by its gather
    if available():
        engine.quantized_pool = CQuantizedPool
    if config.kernels == "compiled":
        from mini_engine.kernels.compiled import CompiledForward   # imports torch's compiler
        engine.compiled = CompiledForward(m)
