"""Metrics for Prometheus: OpenTelemetry instruments exported through OpenTelemetry's Prometheus
exporter, served at `/metrics` (the gateway's own HTTP port; each gRPC service's
BOSS_<SERVICE>_METRICS_LISTEN, e.g. `0.0.0.0:9464`). `docs/operations.md` lists every metric with
the alerts to set on it.

Two kinds of value:

- Counters and histograms (e.g. `boss.context_budget.readings`) are added to where the event
  happens, after its commit.
- Gauges of state (open streams aside) are *sampled*: each service runs a `GaugeSampler` in its event
  loop with probes of its own (in-memory objects such as event consumers, or one cheap query of its
  database), every `SAMPLE_INTERVAL_SECONDS`; a scrape reads the latest sample. A scrape therefore
  never touches the database or asyncio objects from the exporter's thread, and a slow database
  cannot make scrapes time out. A probe that fails keeps its previous readings and logs a warning.

Open gRPC streams are counted by `OpenStreamsInterceptor` on every server (no per-message work for
unary calls; a streamed response passes one extra generator frame).

OpenTelemetry turns names into Prometheus's: dots become underscores, a unit of seconds adds
`_seconds`, counters end in `_total`; curly-brace units (`{event}`) are annotations and dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import grpc
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.resources import Resource

from services.shared.time import utc_now

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
SAMPLE_INTERVAL_SECONDS = 15.0

meter = metrics.get_meter("boss")
_configured = False
_lock = threading.Lock()


def configure_metrics(resource: Resource | None = None) -> None:
    """Installs, once per process, the meter provider every Boss instrument records into: a
    Prometheus reader (what `/metrics` serves) and, when OTEL_EXPORTER_OTLP_ENDPOINT is set, an
    OTLP exporter as well. `resource` names the process (`service.name`; Prometheus shows it in
    `target_info`). Safe to call again (later calls do nothing)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader

    readers: list[MetricReader] = [PrometheusMetricReader()]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    provider = MeterProvider(metric_readers=readers, resource=resource or Resource.create())
    metrics.set_meter_provider(provider)


def metrics_exposition() -> tuple[bytes, str]:
    """The Prometheus text exposition of this process's metrics and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@dataclass
class MetricsEndpoint:
    """The `/metrics` HTTP listener of a gRPC service (prometheus_client's threaded server; any
    path answers the exposition, as prometheus_client does)."""

    listen: str
    _server: Any = field(default=None, repr=False)

    @property
    def port(self) -> int:
        """The bound port (0 before `start`)."""
        return int(self._server.server_port) if self._server is not None else 0

    def start(self) -> None:
        """Binds `listen` ("host:port"; port 0 picks a free one) and serves in a daemon thread.
        Raises ValueError for an address without a port, OSError when it cannot bind."""
        from prometheus_client import start_http_server

        host, separator, port = self.listen.rpartition(":")
        if not separator or not port.isdigit():
            raise ValueError(f"metrics listen address must be host:port, got {self.listen!r}")
        configure_metrics()
        self._server, _thread = start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0")
        log.info("metrics on http://%s:%d%s", host or "0.0.0.0", self.port, METRICS_PATH)

    async def stop(self) -> None:
        """Stops serving (idempotent)."""
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()


def metrics_listen_address(service: str) -> str | None:
    """BOSS_<SERVICE>_METRICS_LISTEN (host:port), or None when the service exposes no metrics port
    (the default: processes that share a machine would otherwise fight over one)."""
    return os.environ.get(f"BOSS_{service.upper()}_METRICS_LISTEN") or None


# --- sampled gauges ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One sampled gauge value: `gauge` is a key of GAUGES, `attributes` its labels (besides
    `service`, which the sampler adds)."""

    gauge: str
    value: float
    attributes: Mapping[str, str] = field(default_factory=dict)


Probe = Callable[[], Awaitable[Iterable[Reading]]]

# name -> (unit, description) of every sampled gauge.
GAUGES: dict[str, tuple[str, str]] = {
    "boss.outbox.head_sequence": ("{event}", "Highest committed sequence of the service's outbox"),
    "boss.outbox.oldest_sequence": (
        "{event}",
        "Lowest sequence still kept in the service's outbox (0 when empty); older ones were pruned",
    ),
    "boss.event_consumer.position": ("{event}", "Last upstream sequence the consumer committed"),
    "boss.event_consumer.pending": (
        "{event}",
        "Upstream events the consumer has received and not yet committed",
    ),
    "boss.event_consumer.lag": (
        "s",
        "Age of the oldest upstream event received and not yet committed (0 when none waits)",
    ),
    "boss.event_consumer.up": (
        "1",
        "1 while the consumer follows its upstream stream, 0 while it waits to retry after a failure",
    ),
    "boss.gateway.sse_clients": ("{client}", "Open Server-Sent Events streams"),
    "boss.context_budget.threads": ("{thread}", "Threads by their current server level"),
    "boss.scheduler.tasks": ("{task}", "Unfinished tasks by status (queued, claimed, running)"),
    "boss.scheduler.task_queue.oldest_age": (
        "s",
        "How long the oldest queued task has waited (0 when none is queued)",
    ),
}

_samplers: weakref.WeakSet[GaugeSampler] = weakref.WeakSet()


def _observe(gauge: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        for sampler in list(_samplers):
            for reading in sampler.latest.get(gauge, ()):
                yield Observation(reading.value, {"service": sampler.service, **reading.attributes})

    return observe


for _name, (_unit, _description) in GAUGES.items():
    meter.create_observable_gauge(_name, callbacks=[_observe(_name)], unit=_unit, description=_description)


class GaugeSampler:
    """Samples a service's gauges in its event loop (module docstring).

    Args:
        service: the `service` label of every reading, e.g. "scheduler".
        probes: coroutines returning readings; each runs once per sample.
        interval_seconds: time between samples (seconds).
    """

    def __init__(
        self, service: str, probes: Iterable[Probe] = (), interval_seconds: float | None = None
    ) -> None:
        self.service = service
        self.probes = list(probes)
        self.interval_seconds = interval_seconds or sample_interval_seconds()
        self.latest: dict[str, list[Reading]] = {}
        self._kept: dict[int, list[Reading]] = {}
        _samplers.add(self)

    async def sample(self) -> None:
        """Runs every probe once and publishes the result (a failing probe keeps its last readings)."""
        for position, probe in enumerate(self.probes):
            try:
                self._kept[position] = list(await probe())
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("%s metrics probe %s failed: %s", self.service, _probe_name(probe), error)
        latest: dict[str, list[Reading]] = {}
        for readings in self._kept.values():
            for reading in readings:
                latest.setdefault(reading.gauge, []).append(reading)
        self.latest = latest

    async def run(self) -> None:
        """Samples every `interval_seconds` until cancelled; the readings vanish with it."""
        _samplers.add(self)
        try:
            while True:
                await self.sample()
                await asyncio.sleep(self.interval_seconds)
        finally:
            self.close()

    def close(self) -> None:
        """Withdraws this sampler's readings from the exposition."""
        _samplers.discard(self)
        self.latest = {}


def live_samplers(service: str | None = None) -> list[GaugeSampler]:
    """The samplers whose readings the exposition shows now (of `service` only, when given)."""
    return [sampler for sampler in list(_samplers) if service is None or sampler.service == service]


def sample_interval_seconds() -> float:
    """BOSS_METRICS_SAMPLE_SECONDS (default 15): time between two samples of the gauges, in
    seconds. Raises ValueError when it is not a positive number."""
    raw = os.environ.get("BOSS_METRICS_SAMPLE_SECONDS") or str(SAMPLE_INTERVAL_SECONDS)
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"BOSS_METRICS_SAMPLE_SECONDS must be a positive number of seconds, got {raw!r}")
    return value


def _probe_name(probe: Probe) -> str:
    return getattr(probe, "__qualname__", repr(probe))


def age_seconds(instant: datetime | None, now: datetime | None = None) -> float:
    """Seconds from `instant` (aware UTC) to `now` (default: the current UTC time); 0 for None and
    for an instant in the future."""
    if instant is None:
        return 0.0
    return max(0.0, ((now or utc_now()) - instant).total_seconds())


class _Backlog(Protocol):
    @property
    def pending_events(self) -> int: ...
    @property
    def oldest_pending_at(self) -> datetime | None: ...


class _EventLogLike(Protocol):
    last_sequence: int


class _ConsumerLike(Protocol):
    stream_name: str
    last_sequence: int
    following: bool

    def backlog(self) -> _Backlog: ...


def event_log_probe(event_log: _EventLogLike) -> Probe:
    """`boss.outbox.head_sequence` of a service's EventLog (in memory: its notifier keeps it)."""

    async def probe() -> list[Reading]:
        return [Reading("boss.outbox.head_sequence", float(event_log.last_sequence))]

    return probe


def consumer_probe(consumer: _ConsumerLike) -> Probe:
    """Position, pending events, lag (seconds) and up of one EventConsumer, labelled
    `consumer` = its stream name (its cursor's key)."""

    async def probe() -> list[Reading]:
        labels = {"consumer": consumer.stream_name}
        backlog = consumer.backlog()
        return [
            Reading("boss.event_consumer.position", float(consumer.last_sequence), labels),
            Reading("boss.event_consumer.pending", float(backlog.pending_events), labels),
            Reading("boss.event_consumer.lag", age_seconds(backlog.oldest_pending_at), labels),
            Reading("boss.event_consumer.up", 1.0 if consumer.following else 0.0, labels),
        ]

    return probe


# --- open streams ------------------------------------------------------------------------------

OPEN_STREAMS = meter.create_up_down_counter(
    "boss.grpc.streams.open",
    unit="{stream}",
    description="Streaming gRPC calls in progress on this server, by method",
)


def _counted(behavior: Callable[..., Any], attributes: dict[str, str]) -> Callable[..., Any] | None:
    """`behavior` wrapped to count itself open while it runs, or None when its kind is unknown."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            OPEN_STREAMS.add(1, attributes)
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                OPEN_STREAMS.add(-1, attributes)

        return stream
    if inspect.iscoroutinefunction(behavior):

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            OPEN_STREAMS.add(1, attributes)
            try:
                return await behavior(request, context)
            finally:
                OPEN_STREAMS.add(-1, attributes)

        return call
    return None


class OpenStreamsInterceptor(grpc.aio.ServerInterceptor):
    """Counts streaming calls in progress (`boss.grpc.streams.open{method}`); unary calls pass
    through untouched."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        attributes = {"method": str(handler_call_details.method)}  # type: ignore[attr-defined]
        kinds = (
            (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
            (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
            (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
        )
        for behavior, make in kinds:
            if behavior is None:
                continue
            counted = _counted(behavior, attributes)
            if counted is None:
                return handler
            return make(
                counted,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
