"""Prometheus metrics for ``specsure serve``, under vLLM's names so its dashboards work unchanged.

The counters are fed from each request's ``SpecStats``, whose definitions already match vLLM's
(see ``specsure.decode.metrics``). As in vLLM, every series carries ``model_name`` and ``engine``
labels, and prometheus_client exposes each counter with a ``_total`` suffix
(``vllm:spec_decode_num_drafts_total``). Each app owns its registry, so several apps (tests, or
two servers in one process) never share counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from specsure.decode.engine import Completion, Engine
from specsure.decode.metrics import SpecStats
from specsure.decode.request import Request

# vLLM 0.33's buckets (vllm/v1/metrics/buckets.py) for each latency histogram.
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
"""vLLM's sources of a prompt's tokens (PromptTokenStats); specsure has no KV transfer, so the last stays 0."""
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's finish reasons, each series there from the start so queries find 0, not nothing: 'abort' is
a generation stopped because its client disconnected or its --request-timeout passed, running or
still waiting, as vLLM counts it; 'error' one that failed inside the engine (its client got a 500);
'repetition' vLLM's repetition detection, which specsure does not have (always 0)."""
LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class Phases:
    """When a request arrived, got its place in the batch, had its first token and its last (perf_counter)."""

    arrived: float
    scheduled: float
    first_token: float
    finished: float


def token_buckets(context: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets for token counts, up to the context (build_1_2_5_buckets)."""
    top, out, scale = context or 1_000_000, [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > top:
                return tuple(float(b) for b in out)
            out.append(step * scale)
        scale *= 10


class ServeMetrics:
    """One registry per app: vLLM-named counters, plus specsure's effective-config info metric."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        self._caching = engine.scheduler.prefix_caching

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=self.registry)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Verification steps with at least one draft "
                              "token.").labels(**labels)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.").labels(**labels)
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted by "
                                       "verification (bonus and recovered tokens excluded).").labels(**labels)
        per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Verification steps whose draft "
                          "token at this position was accepted.", "position")
        self._per_pos = lambda i: per_pos.labels(**labels, position=str(i))
        config = engine.resolution.config
        for i in range(config.num_speculative_tokens if config is not None else 0):
            self._per_pos(i)  # every position exists from the start, at 0, so rate() works at once
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.").labels(**labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Output tokens generated.").labels(**labels)
        self.cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache "
                                     "(--enable-prefix-caching).").labels(**labels)
        self.cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache: their KV "
                                  "cache was reused, not computed.").labels(**labels)
        self.cached_tokens = counter("vllm:prompt_tokens_cached", "Prompt tokens whose KV cache was reused from "
                                     "the prefix cache (local; there is no external one).").labels(**labels)
        by_source = counter("vllm:prompt_tokens_by_source", "Prompt tokens by source: computed, or found in the "
                            "prefix cache.", "source")
        self._by_source = {source: by_source.labels(**labels, source=source) for source in PROMPT_SOURCES}
        success = counter("vllm:request_success", "Finished requests, by finish reason.", "finished_reason")
        self._success = lambda reason: success.labels(**labels, finished_reason=reason)
        for reason in FINISH_REASONS:
            self._success(reason)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(**labels)

        self.latency = histogram("vllm:e2e_request_latency_seconds", "Request latency from arrival (after "
                                 "validation) to the last token, queueing included.", LATENCY_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Time a request waited for a place in the "
                                    "running batch.", LATENCY_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", "Time from a request's place in the "
                                      "batch to its first token.", LATENCY_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds", "Time from a request's first token to its "
                                     "last.", LATENCY_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds", "Time from a request's place in the "
                                        "batch to its last token.", LATENCY_BUCKETS)
        sizes = token_buckets(engine.target.lm.max_context)
        self.prompt_sizes = histogram("vllm:request_prompt_tokens", "Prompt tokens of each finished request.", sizes)
        self.output_sizes = histogram("vllm:request_generation_tokens", "Generated tokens of each finished request.",
                                      sizes)
        self.computed_sizes = histogram("vllm:request_prefill_kv_computed_tokens", "Prompt tokens of each finished "
                                        "request whose KV was computed (the prefix cache's excluded).", sizes)
        self.max_tokens = histogram("vllm:request_params_max_tokens", "The max_tokens of each finished request "
                                    "(its sampling parameter, the server's default where the client gave none).",
                                    sizes)
        self.n_params = histogram("vllm:request_params_n", "The n of each finished request (counted once for its "
                                  "choices).", REQUEST_PARAMS_N_BUCKETS)
        self.max_generated = histogram("vllm:request_max_num_generation_tokens", "The most tokens any choice of a "
                                       "finished request generated (counted once for its choices).", sizes)
        self.per_output_token = histogram("vllm:request_time_per_output_token_seconds", "A finished request's decode "
                                          "time over its output tokens after the first (0 for one token).",
                                          INTER_TOKEN_LATENCY_BUCKETS)
        self.preemptions = histogram("vllm:request_num_preemptions", "Preemptions of each finished request: always "
                                     "0 (specsure never preempts); here for vLLM's dashboards.", PREEMPTION_BUCKETS)
        counter("vllm:num_preemptions", "Requests preempted to free KV cache. specsure never preempts (a request "
                "keeps its slot to its end), so this stays 0; it is here for vLLM's dashboards.").labels(**labels)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Tokens an engine step processed: the "
                                          "prompt tokens it computed and the output tokens it committed.",
                                          ITERATION_TOKENS_BUCKETS)
        self.first_token = histogram("vllm:time_to_first_token_seconds", "Time from arrival (after validation) "
                                     "to the first output token, queueing included.", TIME_TO_FIRST_TOKEN_BUCKETS)
        self.inter_token = histogram("vllm:inter_token_latency_seconds", "Time between two engine steps' "
                                     "output (a step commits 1 to k + 1 tokens).", INTER_TOKEN_LATENCY_BUCKETS)
        rejections = Counter("vllm:admission_rejections", "Requests refused with 503 because the waiting queue "
                             "was full (--max-queue), by reason.", ["model_name", "reason"], registry=self.registry)
        self.rejected = rejections.labels(model_name=model_name, reason="max_num_queued_reqs")
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch now (at most --max-num-seqs).",
                             LABELS, registry=self.registry).labels(**labels)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests admitted and waiting for a place in the running batch.",
                             LABELS, registry=self.registry).labels(**labels)
        self.kv_cache = Gauge("vllm:kv_cache_usage_perc", "The share of the KV cache in use (1 = full): the cached "
                              "tokens of the requests in the batch over --max-num-seqs full contexts.", LABELS,
                              registry=self.registry).labels(**labels)
        Info("specsure_speculative_config", "The effective speculative config, with each field's source "
             "(user, checkpoint, path, default, derived), and the method actually running.",
             registry=self.registry).info(config_labels(engine, model_name))

    def observe(self, completion: Completion, times: Phases, max_tokens: int | None = None) -> None:
        """Count one finished request (one choice), whose sampling parameters asked for ``max_tokens``."""
        self._count(completion.stats, len(completion.prompt_token_ids), len(completion.token_ids),
                    completion.cached_tokens)
        self._success(completion.finish_reason).inc()
        self.latency.observe(times.finished - times.arrived)
        self.queue_time.observe(times.scheduled - times.arrived)
        self.prefill_time.observe(times.first_token - times.scheduled)
        self.decode_time.observe(times.finished - times.first_token)
        self.inference_time.observe(times.finished - times.scheduled)
        self.prompt_sizes.observe(len(completion.prompt_token_ids))
        self.output_sizes.observe(len(completion.token_ids))
        self.computed_sizes.observe(len(completion.prompt_token_ids) - completion.cached_tokens)
        if max_tokens is not None:
            self.max_tokens.observe(max_tokens)
        outputs = len(completion.token_ids) - 1  # the first came with the prefill, as vLLM counts
        self.per_output_token.observe((times.finished - times.first_token) / outputs if outputs > 0 else 0.0)
        self.preemptions.observe(0)

    def group_finished(self, n: int, most_generated: int) -> None:
        """Count one request with ``n`` choices once its last choice has ended (finished or aborted), as
        vLLM counts a parent request: its n, and the most tokens any of its choices generated."""
        self.n_params.observe(n)
        self.max_generated.observe(most_generated)

    def aborted(self, request: Request) -> None:
        """Count one generation stopped before its end (client gone, or timeout), waiting or running.
        vLLM counts tokens as its steps make them, so an aborted request's drafted and generated tokens
        count too, and its prompt once its prefill has ended (vLLM counts a prompt when its prefill
        completes); one that never got a slot counts only as an abort."""
        if request.lm is not None:
            prefilled = len(request.prompt) if request.prefilled >= len(request.prompt) else 0
            self._count(request.stats, prefilled, len(request.output), request.cached_tokens if prefilled else 0)
        self._success("abort").inc()

    def errored(self) -> None:
        """Count one generation that failed inside the engine (its client got a 500)."""
        self._success("error").inc()

    def _count(self, stats: SpecStats, prompt_tokens: int, generated: int, cached: int) -> None:
        self.drafts.inc(stats.drafts)
        self.draft_tokens.inc(stats.draft_tokens)
        self.accepted_tokens.inc(stats.accepted_tokens)
        for i, n in enumerate(stats.accepted_per_position):
            self._per_pos(i).inc(n)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        self.cached_tokens.inc(cached)
        self._by_source["local_compute"].inc(prompt_tokens - cached)
        self._by_source["local_cache_hit"].inc(cached)
        if self._caching:
            self.cache_queries.inc(prompt_tokens)
            self.cache_hits.inc(cached)

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's registry."""
        return generate_latest(self.registry)


def config_labels(engine: Engine, model_name: str) -> dict[str, str]:
    """``{field: value, field_source: source}`` for every resolved field, plus the running method."""
    labels = {"model_name": model_name, "running_method": engine.speculative_method or ""}
    for name, decision in engine.resolution.to_dict().items():
        labels[name] = "" if decision["value"] is None else str(decision["value"])
        labels[f"{name}_source"] = decision["source"]
    labels.setdefault("method", "")  # speculation off: the series still exists, so queries need no special case
    labels.setdefault("method_source", "")
    return labels
