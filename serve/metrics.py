"""The service's Prometheus metrics (``GET /metrics``), in a registry of its own, so two
services in one process (the tests) count apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

#: Seconds buckets of the request latency: a lone query on a warm model is milliseconds, a
#: support set of hundreds of sentences seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    """Requests, latency, batch sizes, errors, the support-set cache and the loaded version."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("regrab_serve_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("regrab_serve_errors", "requests answered with a 4xx or 5xx",
                              ["endpoint", "status"], registry=r)
        self.latency = Histogram("regrab_serve_request_seconds", "request latency",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("regrab_serve_in_flight", "requests being answered", registry=r)
        self.batch_queries = Histogram("regrab_serve_batch_queries",
                                       "queries per forward pass", buckets=SIZE_BUCKETS,
                                       registry=r)
        self.batch_requests = Histogram("regrab_serve_batch_requests",
                                        "requests per forward pass", buckets=SIZE_BUCKETS,
                                        registry=r)
        self.pass_seconds = Histogram("regrab_serve_pass_seconds",
                                      "seconds of each forward pass in the model's worker",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.support_encoded = Counter("regrab_serve_support_encoded",
                                       "support sets encoded (first use on a version)",
                                       registry=r)
        self.support_sets = Gauge("regrab_serve_support_sets", "support sets cached",
                                  registry=r)
        self.support_bytes = Gauge("regrab_serve_support_bytes",
                                   "bytes the cached support sets hold", registry=r)
        self.evicted = Counter("regrab_serve_support_evicted", "support sets evicted",
                               registry=r)
        self.ready = Gauge("regrab_serve_ready", "1 when a model answers", registry=r)
        self.model = Info("regrab_serve_model", "the version answering", registry=r)
        self.loads = Counter("regrab_serve_loads", "model loads", ["outcome"], registry=r)

    def batch(self, requests: int, queries: int, seconds: float) -> None:
        self.batch_requests.observe(requests)
        self.batch_queries.observe(queries)
        self.pass_seconds.observe(seconds)
