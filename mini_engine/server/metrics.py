"""/metrics: the engine's figures under vLLM's Prometheus names, types, labels and buckets, so
that whatever reads vLLM's server (tasks 6-8, the dashboard, `vllm bench serve`) reads this
one unchanged. Each figure is set by the step loop, where it happens: after each step
(tokens, TTFT, inter-token gaps, the pool's use) and when a request ends.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's buckets (vllm/v1/metrics/loggers.py), so a histogram reads the same in both servers
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


class ServerMetrics:
    """Every series of one server, in a registry of its own (the process-wide default one also
    holds Python's own collectors, which vLLM's /metrics shows too: both are exported)."""

    def __init__(self, model_name: str, cache_info: dict[str, str], spec_decode: bool):
        self.registry = CollectorRegistry()
        names = ["model_name", "engine"]
        labels = {"model_name": model_name, "engine": "0"}

        def one(kind, name: str, doc: str, **kw):
            return kind(name, doc, names, registry=self.registry, **kw).labels(**labels)

        self.running = one(Gauge, "vllm:num_requests_running", "Number of requests in model "
                           "execution batches.")
        self.waiting = one(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to "
                           "be processed.")
        self.kv_usage = one(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 "
                            "percent usage.")
        self.prompt_tokens = one(Counter, "vllm:prompt_tokens", "Number of prefill tokens "
                                 "processed.")
        self.generation_tokens = one(Counter, "vllm:generation_tokens", "Number of generation "
                                     "tokens processed.")
        self.preemptions = one(Counter, "vllm:num_preemptions", "Cumulative number of "
                               "preemption from the engine.")
        self.prefix_queries = one(Counter, "vllm:prefix_cache_queries", "Prefix cache queries, "
                                  "in terms of number of queried tokens.")
        self.prefix_hits = one(Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms "
                               "of number of cached tokens.")
        self.iteration_tokens = one(Histogram, "vllm:iteration_tokens_total", "Histogram of "
                                    "number of tokens per engine_step.",
                                    buckets=STEP_BUCKETS)
        self.ttft = one(Histogram, "vllm:time_to_first_token_seconds", "Histogram of time to "
                        "first token in seconds.", buckets=TTFT_BUCKETS)
        self.itl = one(Histogram, "vllm:inter_token_latency_seconds", "Histogram of inter-token "
                       "latency in seconds.", buckets=ITL_BUCKETS)
        self.e2e = one(Histogram, "vllm:e2e_request_latency_seconds", "Histogram of e2e request "
                       "latency in seconds.", buckets=E2E_BUCKETS)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          names + ["finished_reason"], registry=self.registry)
        self.finished = {reason: success.labels(**labels, finished_reason=reason)
                         for reason in FINISH_REASONS}
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     sorted([*cache_info, "engine"]), registry=self.registry)   # as vLLM's
        info.labels(**cache_info, engine="0").set(1)
        self.spec_drafts = self.spec_draft_tokens = self.spec_accepted = None
        if spec_decode:    # vLLM exports these only when speculation is on
            self.spec_drafts = one(Counter, "vllm:spec_decode_num_drafts", "Number of spec "
                                   "decoding drafts.")
            self.spec_draft_tokens = one(Counter, "vllm:spec_decode_num_draft_tokens",
                                         "Number of draft tokens.")
            self.spec_accepted = one(Counter, "vllm:spec_decode_num_accepted_tokens",
                                     "Number of accepted tokens.")
