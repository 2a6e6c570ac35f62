"""mini_engine's own tests: the engine against transformers, its scheduler searched by hypothesis,
each mechanism a lesson added (prefix cache, chunked prefill, speculation, 8-bit KV) and each
kernel against its torch reference."""
