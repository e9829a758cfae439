"""Reading this process's Prometheus exposition in tests, as a scrape sees it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from services.shared.metrics import configure_metrics, live_samplers, metrics_exposition


def metric_value(exposition: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` whose labels include `labels` (None when there is none).
    Raises AssertionError when several samples match."""
    found = [
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items())
    ]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


async def scrape(service: str | None = None) -> str:
    """Samples the live gauges (of `service`, when given) and returns the exposition text."""
    configure_metrics()
    for sampler in live_samplers(service):
        await sampler.sample()
    body, _content_type = metrics_exposition()
    return body.decode()
