"""vLLM's Prometheus /metrics, parsed with prometheus_client's own parser."""
from __future__ import annotations

import threading
import time

import requests
from prometheus_client.parser import text_string_to_metric_families


def parse(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets (one engine: one value each)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def info_labels(text: str, name: str) -> dict[str, str]:
    """The labels of an *_info gauge, e.g. vllm:cache_config_info (block size, KV tokens...)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (name, name + "_info") or family.name == name:
                return dict(sample.labels)
    return {}


def fetch(base_url: str, timeout: float = 5) -> str:
    resp = requests.get(f"{base_url}/metrics", timeout=timeout)
    resp.raise_for_status()
    return resp.text


class Sampler:
    """Samples running/waiting requests from /metrics in the background during a load run."""

    def __init__(self, base_url: str, interval_s: float = 0.2):
        self.base_url = base_url
        self.interval_s = interval_s
        self.max_running = 0
        self.max_waiting = 0
        self.num_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                values = parse(fetch(self.base_url, timeout=2))
            except (requests.RequestException, ValueError):
                values = None
            if values is not None:
                self.num_samples += 1
                self.max_running = max(self.max_running, int(values.get("vllm:num_requests_running", 0)))
                self.max_waiting = max(self.max_waiting, int(values.get("vllm:num_requests_waiting", 0)))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
