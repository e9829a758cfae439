"""Offline checks of the container recipe and the Kubernetes manifests under `deploy/`.

The kustomize base and each overlay are rendered with `kubectl kustomize` (no cluster needed) and
every document is validated strictly (unknown fields fail) against the Kubernetes 1.30 schemas
bundled with kubernetes-validate. The other tests assert the properties that decide whether the
manifests work once applied: probes on the right port and health service, hardened pods, a
Service / PodDisruptionBudget / ServiceAccount per Deployment, headless Services behind the client
addresses, an SSE-safe Ingress, default-deny network policies and the overlay differences.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

Manifest = dict[str, Any]

REPO_ROOT = Path(__file__).resolve().parents[3]
DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
BASE = K8S / "base"
TARGETS = {
    "base": BASE,
    "local": K8S / "overlays" / "local",
    "production": K8S / "overlays" / "production",
}
OVERLAYS = ("local", "production")
KUBERNETES_VERSION = "1.30.0"
KUBECTL = shutil.which("kubectl")

# name -> (module, gRPC port, health service name, environment prefix)
GRPC_SERVICES = {
    "context-budget": (
        "context_budget",
        50051,
        "boss.context_budget.v1.ContextBudgetService",
        "CONTEXT_BUDGET",
    ),
    "scheduler": ("scheduler", 50052, "boss.scheduler.v1.SchedulerService", "SCHEDULER"),
    "conversations": ("conversations", 50053, "boss.conversations.v1.ConversationsService", "CONVERSATIONS"),
}
GATEWAY = "gateway"
GATEWAY_PORT = 8080
METRICS_PORT = 9464  # every process's Prometheus listener (services/shared/metrics.py)
DEPLOYMENTS = {*GRPC_SERVICES, GATEWAY}
AUTOSCALED = {GATEWAY, "context-budget"}
APP_GRACE_SECONDS = 10  # the servers' own graceful-stop window after SIGTERM
IMAGE_USER = 10001
CLUSTER_SCOPED_KINDS = {"Namespace"}
RECOMMENDED_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/component"}


# --- helpers ---------------------------------------------------------------------------------------


def render(target: Path) -> list[Manifest]:
    """Runs `kubectl kustomize` on a kustomization folder and returns its documents."""
    assert KUBECTL is not None
    result = subprocess.run(
        [KUBECTL, "kustomize", str(target)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def raw_manifest_files() -> list[Path]:
    """Every plain manifest file under deploy/k8s (kustomization files are not Kubernetes objects)."""
    return sorted(path for path in K8S.rglob("*.yaml") if path.name != "kustomization.yaml")


def of_kind(docs: list[Manifest], kind: str) -> list[Manifest]:
    """The documents of one kind."""
    return [doc for doc in docs if doc["kind"] == kind]


def named(docs: list[Manifest], kind: str, name: str) -> Manifest:
    """The single document of `kind` called `name`."""
    matches = [doc for doc in of_kind(docs, kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name!r}, found {len(matches)}"
    return matches[0]


def name_of(doc: Manifest) -> str:
    """metadata.name."""
    return str(doc["metadata"]["name"])


def component_of(doc: Manifest) -> str | None:
    """The app.kubernetes.io/component label of an object."""
    return doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def pod_spec(workload: Manifest) -> Manifest:
    """The pod spec of a Deployment or Job."""
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: Manifest) -> dict[str, str]:
    """The labels its pods carry."""
    return workload["spec"]["template"]["metadata"]["labels"]


def containers(workload: Manifest) -> list[Manifest]:
    """Init and regular containers of a workload."""
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def workloads(docs: list[Manifest]) -> list[Manifest]:
    """Deployments and Jobs: everything that starts pods."""
    return of_kind(docs, "Deployment") + of_kind(docs, "Job")


def matches_selector(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels / matchExpressions) selects `labels`."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def any_selects(selectors: list[Manifest], labels: dict[str, str]) -> bool:
    """Whether any of several LabelSelectors selects `labels`."""
    return any(matches_selector(selector, labels) for selector in selectors)


def service_selects(service: Manifest, labels: dict[str, str]) -> bool:
    """Whether a Service's (plain map) selector picks pods with `labels`."""
    selector = service["spec"].get("selector") or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def config_data(docs: list[Manifest]) -> dict[str, str]:
    """The data of the generated boss-config ConfigMap."""
    maps = [doc for doc in of_kind(docs, "ConfigMap") if name_of(doc).startswith("boss-config")]
    assert len(maps) == 1
    return maps[0]["data"]


def effective_min_replicas(docs: list[Manifest], deployment: Manifest) -> int:
    """The fewest pods a Deployment runs: its autoscaler's minimum, else `replicas` (default 1)."""
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        if target["kind"] == "Deployment" and target["name"] == name_of(deployment):
            return int(hpa["spec"].get("minReplicas", 1))
    return int(deployment["spec"].get("replicas", 1))


def secret_key_refs(docs: list[Manifest]) -> Iterator[Manifest]:
    """The secretKeyRef of every Secret value a container reads."""
    for workload in workloads(docs):
        for container in containers(workload):
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    yield ref


def parse_quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity as a plain number (cores or bytes)."""
    text = str(value)
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in suffixes.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def sleep_seconds(container: Manifest) -> int:
    """How long a container's `sleep N` preStop hook delays SIGTERM (0 without one)."""
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


# --- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Manifest]]:
    """The base and both overlays, rendered once per test module."""
    if KUBECTL is None:
        pytest.skip("kubectl is not installed, so the kustomizations cannot be rendered offline")
    return {name: render(path) for name, path in TARGETS.items()}


@pytest.fixture(params=OVERLAYS)
def docs(request: pytest.FixtureRequest, renders: dict[str, list[Manifest]]) -> list[Manifest]:
    """One rendered overlay (the test runs once per overlay)."""
    return renders[request.param]


@pytest.fixture
def production(renders: dict[str, list[Manifest]]) -> list[Manifest]:
    """The rendered production overlay."""
    return renders["production"]


@pytest.fixture
def local(renders: dict[str, list[Manifest]]) -> list[Manifest]:
    """The rendered local overlay."""
    return renders["local"]


# --- schema validation -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", raw_manifest_files(), ids=lambda path: str(path.relative_to(K8S)))
def test_raw_manifest_files_are_valid_kubernetes_objects(path: Path) -> None:
    """Each hand-written file validates strictly on its own, before kustomize touches it."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert documents, f"{path} holds no document"
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_document_is_valid(renders: dict[str, list[Manifest]], target: str) -> None:
    """The rendered base and overlays validate strictly against the Kubernetes 1.30 schemas."""
    assert renders[target]
    for doc in renders[target]:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


# --- every Deployment ------------------------------------------------------------------------------


def test_each_service_has_exactly_one_deployment(docs: list[Manifest]) -> None:
    """The four processes run as Deployments named after them, with the image `boss`."""
    assert {name_of(doc) for doc in of_kind(docs, "Deployment")} == DEPLOYMENTS
    for workload in workloads(docs):
        for container in containers(workload):
            assert re.fullmatch(r"(.+/)?boss[:@].+", container["image"]), container["image"]


def test_grpc_deployments_run_their_module_and_probe_their_health_service(docs: list[Manifest]) -> None:
    """Native gRPC probes hit the container's own port; readiness asks for the business service,
    liveness for the whole server, so a service reported NOT_SERVING is unready, not restarted."""
    for name, (module, port, health_service, _) in GRPC_SERVICES.items():
        (container,) = containers(named(docs, "Deployment", name))
        assert container["command"] == ["python", "-m", f"services.{module}", "serve"]
        assert [p["containerPort"] for p in container["ports"]] == [port, METRICS_PORT]
        readiness, liveness = container["readinessProbe"]["grpc"], container["livenessProbe"]["grpc"]
        assert readiness == {"port": port, "service": health_service}
        assert liveness == {"port": port, "service": ""}
        assert container["startupProbe"]["grpc"]["port"] == port


def test_gateway_runs_its_module_and_probes_its_http_endpoints(docs: list[Manifest]) -> None:
    """The gateway is probed over HTTP: /readyz for readiness, /healthz for liveness, on 8080."""
    (container,) = containers(named(docs, "Deployment", GATEWAY))
    assert container["command"] == ["python", "-m", "services.bff_gateway", "serve"]
    assert [p["containerPort"] for p in container["ports"]] == [GATEWAY_PORT, METRICS_PORT]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": GATEWAY_PORT}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": GATEWAY_PORT}


def test_pods_run_as_the_image_user_with_a_read_only_root_and_no_capabilities(docs: list[Manifest]) -> None:
    """Deployments and Jobs meet the restricted Pod Security Standard and keep /tmp writable."""
    for workload in workloads(docs):
        spec = pod_spec(workload)
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True, name_of(workload)
        assert security["runAsUser"] == IMAGE_USER
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        empty_dirs = {volume["name"] for volume in spec.get("volumes", []) if "emptyDir" in volume}
        for container in containers(workload):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name_of(workload)
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "add" not in context["capabilities"]
            tmp = [mount for mount in container["volumeMounts"] if mount["mountPath"] == "/tmp"]
            assert len(tmp) == 1 and tmp[0]["name"] in empty_dirs, f"{name_of(workload)}: /tmp"


def test_containers_request_and_limit_cpu_and_memory(docs: list[Manifest]) -> None:
    """Every container has requests and limits for both resources, and no request exceeds its limit."""
    for workload in workloads(docs):
        for container in containers(workload):
            resources = container["resources"]
            for resource in ("cpu", "memory"):
                request = parse_quantity(resources["requests"][resource])
                limit = parse_quantity(resources["limits"][resource])
                assert 0 < request <= limit, f"{name_of(workload)} {resource}"


def test_termination_grace_outlasts_the_pre_stop_pause_and_the_app_grace(docs: list[Manifest]) -> None:
    """SIGKILL must not cut the servers' 10 s graceful stop short, after the preStop pause."""
    for deployment in of_kind(docs, "Deployment"):
        spec = pod_spec(deployment)
        pause = max(sleep_seconds(container) for container in containers(deployment))
        assert spec["terminationGracePeriodSeconds"] > pause + APP_GRACE_SECONDS, name_of(deployment)


def test_every_deployment_has_a_service_a_disruption_budget_and_its_own_account(docs: list[Manifest]) -> None:
    """A ClusterIP Service targets the container port, a PDB covers the pods, and each Deployment
    runs under a ServiceAccount no other Deployment shares."""
    accounts = {name_of(account) for account in of_kind(docs, "ServiceAccount")}
    used_accounts: list[str] = []
    for deployment in of_kind(docs, "Deployment"):
        labels = pod_labels(deployment)
        assert matches_selector(deployment["spec"]["selector"], labels)
        (container,) = containers(deployment)
        port = container["ports"][0]
        services = [
            service
            for service in of_kind(docs, "Service")
            if service_selects(service, labels) and service["spec"].get("clusterIP") != "None"
        ]
        assert len(services) == 1, f"{name_of(deployment)}: {len(services)} ClusterIP Services"
        targets = {service_port["targetPort"] for service_port in services[0]["spec"]["ports"]}
        assert targets & {port["name"], port["containerPort"]}, name_of(deployment)
        budgets = [
            pdb
            for pdb in of_kind(docs, "PodDisruptionBudget")
            if matches_selector(pdb["spec"]["selector"], labels)
        ]
        assert len(budgets) == 1, f"{name_of(deployment)}: {len(budgets)} PodDisruptionBudgets"
        assert budgets[0]["spec"].get("maxUnavailable") == 1
        account = pod_spec(deployment)["serviceAccountName"]
        assert account in accounts
        used_accounts.append(account)
    assert len(used_accounts) == len(set(used_accounts)), "Deployments share a ServiceAccount"


def test_no_service_or_budget_selects_migration_pods(production: list[Manifest]) -> None:
    """Job pods never land in a Service's endpoints or count against a service's budget."""
    jobs = of_kind(production, "Job")
    assert jobs
    for job in jobs:
        labels = pod_labels(job)
        assert not any(service_selects(service, labels) for service in of_kind(production, "Service"))
        for pdb in of_kind(production, "PodDisruptionBudget"):
            assert not matches_selector(pdb["spec"]["selector"], labels)


def test_grpc_clients_dial_headless_services(docs: list[Manifest]) -> None:
    """Clients resolve one address per pod (headless Service, dns:/// target) and every server
    listens on all interfaces at its documented port."""
    config = config_data(docs)
    for name, (_, port, _, prefix) in GRPC_SERVICES.items():
        headless = named(docs, "Service", f"{name}-headless")
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["selector"] == named(docs, "Service", name)["spec"]["selector"]
        assert [p["port"] for p in headless["spec"]["ports"]] == [port]
        assert config[f"BOSS_{prefix}_ADDRESS"] == f"dns:///{name}-headless:{port}"
        assert config[f"BOSS_{prefix}_LISTEN"] == f"0.0.0.0:{port}"
    assert config["BOSS_GATEWAY_LISTEN"] == f"0.0.0.0:{GATEWAY_PORT}"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in config


def test_deployments_read_the_shared_config_and_only_their_own_secrets(docs: list[Manifest]) -> None:
    """Each Deployment loads boss-config; a gRPC service reads its own database URL and nobody else's."""
    config_name = next(name_of(m) for m in of_kind(docs, "ConfigMap") if name_of(m).startswith("boss-config"))
    for deployment in of_kind(docs, "Deployment"):
        (container,) = containers(deployment)
        assert {"configMapRef": {"name": config_name}} in container["envFrom"]
        names = {variable["name"] for variable in container["env"]}
        urls = {name for name in names if name.endswith("_DATABASE_URL")}
        if name_of(deployment) == GATEWAY:
            assert urls == set()
        else:
            assert urls == {f"BOSS_{GRPC_SERVICES[name_of(deployment)][3]}_DATABASE_URL"}
        assert "BOSS_AUTH_SECRET" in names


# --- edge, network, scaling ------------------------------------------------------------------------


def test_sse_ingress_does_not_buffer_or_compress(docs: list[Manifest]) -> None:
    """The gateway's Ingress streams SSE: buffering off, hour-long read timeout, no gzip switched on."""
    ingress = named(docs, "Ingress", GATEWAY)
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    assert not any("gzip" in key or "gzip on" in value for key, value in annotations.items())
    backends = [
        path["backend"]["service"] for rule in ingress["spec"]["rules"] for path in rule["http"]["paths"]
    ]
    assert backends == [{"name": GATEWAY, "port": {"name": "http"}}]


def test_grpc_ingress_routes_each_service_over_grpc(docs: list[Manifest]) -> None:
    """Workers reach the gRPC services through grpc.boss.example with nginx's GRPC backend protocol,
    one path per gRPC service, over TLS."""
    ingress = named(docs, "Ingress", "grpc")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "grpc.boss.example"
    assert any(rule["host"] in tls["hosts"] for tls in ingress["spec"]["tls"])
    routes = {path["path"]: path["backend"]["service"]["name"] for path in rule["http"]["paths"]}
    assert routes == {f"/{health}": name for name, (_, _, health, _) in GRPC_SERVICES.items()}


def test_network_policies_deny_by_default(docs: list[Manifest]) -> None:
    """A policy with an empty pod selector and no ingress rules blocks everything not allowed."""
    default_deny = [
        policy
        for policy in of_kind(docs, "NetworkPolicy")
        if policy["spec"]["podSelector"] == {}
        and policy["spec"]["policyTypes"] == ["Ingress"]
        and not policy["spec"].get("ingress")
    ]
    assert len(default_deny) == 1


def test_network_policies_open_only_the_intended_paths(docs: list[Manifest]) -> None:
    """The gateway accepts only the ingress controller; gRPC services accept the gateway, each
    other and the ingress controller (workers), each on its own port only."""
    grpc_peer = {"app.kubernetes.io/component": "grpc-server"}
    gateway_peer = pod_labels(named(docs, "Deployment", GATEWAY))
    job_peer = pod_labels(of_kind(docs, "Deployment")[0]) | {"app.kubernetes.io/component": "migration"}
    for deployment in of_kind(docs, "Deployment"):
        labels = pod_labels(deployment)
        (container,) = containers(deployment)
        port = container["ports"][0]["containerPort"]
        policies = [
            policy
            for policy in of_kind(docs, "NetworkPolicy")
            if policy["spec"]["podSelector"] and matches_selector(policy["spec"]["podSelector"], labels)
        ]
        assert len(policies) == 1, name_of(deployment)
        rule, scrape = policies[0]["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == [port]
        assert [p["port"] for p in scrape["ports"]] == [METRICS_PORT]
        assert [peer["namespaceSelector"]["matchLabels"] for peer in scrape["from"]] == [
            {"kubernetes.io/metadata.name": "monitoring"}
        ]
        peers = rule["from"]
        assert all("ipBlock" not in peer for peer in peers)
        controller = [peer for peer in peers if "namespaceSelector" in peer]
        assert controller and all(
            peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ingress-nginx"}
            for peer in controller
        )
        in_namespace = [peer["podSelector"] for peer in peers if "namespaceSelector" not in peer]
        if name_of(deployment) == GATEWAY:
            assert in_namespace == []
        else:
            assert any_selects(in_namespace, gateway_peer) and any_selects(in_namespace, grpc_peer)
            assert not any_selects(in_namespace, job_peer)


def test_every_process_is_scraped_on_its_metrics_port_apart_from_its_api(docs: list[Manifest]) -> None:
    """Each Deployment's pods carry Prometheus's scrape annotations for the `metrics` port, and the
    shared config has every process listen there (the gateway too, so the public Ingress in front
    of its API port never serves /metrics)."""
    config = (BASE / "config.env").read_text()
    for deployment in of_kind(docs, "Deployment"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
        }, name_of(deployment)
        (container,) = containers(deployment)
        assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in container["ports"]
    for prefix in ("GATEWAY", *(environment for *_, environment in GRPC_SERVICES.values())):
        assert f"BOSS_{prefix}_METRICS_LISTEN=0.0.0.0:{METRICS_PORT}\n" in config, prefix


def test_autoscalers_cover_gateway_and_context_budget(production: list[Manifest]) -> None:
    """autoscaling/v2 HPAs scale exactly those two on CPU; their Deployments leave `replicas` to them."""
    autoscalers = of_kind(production, "HorizontalPodAutoscaler")
    assert {hpa["spec"]["scaleTargetRef"]["name"] for hpa in autoscalers} == AUTOSCALED
    for hpa in autoscalers:
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
        target = named(production, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"]


def test_every_object_carries_the_recommended_labels(docs: list[Manifest]) -> None:
    """app.kubernetes.io/name, part-of and component on every object and every pod template."""
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "boss", f"{doc['kind']} {name_of(doc)}"
        assert labels.get("app.kubernetes.io/name") and labels.get("app.kubernetes.io/component")
    for workload in workloads(docs):
        assert pod_labels(workload).keys() >= RECOMMENDED_LABELS, name_of(workload)


# --- overlays --------------------------------------------------------------------------------------


def test_production_runs_pinned_replicated_and_migrates_explicitly(production: list[Manifest]) -> None:
    """Namespace boss, a pinned release image, two or more pods per service, and no migration on
    start: one Job per gRPC service runs `migrate` against its own database instead."""
    assert named(production, "Namespace", "boss")
    for doc in production:
        if doc["kind"] not in CLUSTER_SCOPED_KINDS:
            assert doc["metadata"]["namespace"] == "boss", f"{doc['kind']} {name_of(doc)}"
    for workload in workloads(production):
        for container in containers(workload):
            image = container["image"]
            assert "@sha256:" in image or not re.search(r":(dev|latest)$|^[^:]+$", image), image
    for deployment in of_kind(production, "Deployment"):
        assert effective_min_replicas(production, deployment) >= 2, name_of(deployment)
    assert config_data(production)["BOSS_MIGRATE_ON_START"] == "false"
    for name, (module, _, _, prefix) in GRPC_SERVICES.items():
        job = named(production, "Job", f"{name}-migrate")
        (container,) = containers(job)
        assert container["command"] == ["python", "-m", f"services.{module}", "migrate"]
        assert pod_spec(job)["restartPolicy"] == "Never"
        urls = [v for v in container["env"] if v["name"].endswith("_DATABASE_URL")]
        assert [v["name"] for v in urls] == [f"BOSS_{prefix}_DATABASE_URL"]
        assert urls[0]["valueFrom"]["secretKeyRef"]["key"] == f"{name}-database-url"


def test_production_migration_jobs_apply_on_their_own(production: list[Manifest]) -> None:
    """`kubectl apply -l app.kubernetes.io/component=migration` brings everything a Job needs
    except the Secret: its ServiceAccount is labelled too, and it reads no ConfigMap."""
    selected = [doc for doc in production if component_of(doc) == "migration"]
    selected_accounts = {name_of(doc) for doc in selected if doc["kind"] == "ServiceAccount"}
    for job in of_kind(production, "Job"):
        assert job in selected
        assert pod_spec(job)["serviceAccountName"] in selected_accounts
        for container in containers(job):
            assert "envFrom" not in container
            assert not any("configMapKeyRef" in v.get("valueFrom", {}) for v in container["env"])


def test_local_runs_one_dev_replica_that_migrates_on_start(local: list[Manifest]) -> None:
    """One pod per service from the locally built boss:dev, no autoscalers, migrations on start
    and therefore no migration Jobs."""
    for deployment in of_kind(local, "Deployment"):
        assert deployment["spec"]["replicas"] == 1
        (container,) = containers(deployment)
        assert container["image"] == "boss:dev"
        assert container["imagePullPolicy"] == "IfNotPresent"
    assert of_kind(local, "HorizontalPodAutoscaler") == []
    assert of_kind(local, "Job") == []
    assert config_data(local)["BOSS_MIGRATE_ON_START"] == "true"


def test_every_secret_key_read_is_documented_and_provided_locally(renders: dict[str, list[Manifest]]) -> None:
    """The example Secret documents every key a workload reads, with placeholders only, and is
    kept out of the base so applying it can never overwrite a real Secret."""
    example_path = BASE / "secret.example.yaml"
    example = yaml.safe_load(example_path.read_text())
    assert example["metadata"]["name"] == "boss-secrets"
    assert all("CHANGE-ME" in value for value in example["stringData"].values())
    assert example_path.name not in yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    assert of_kind(renders["production"], "Secret") == []
    needed = {ref["key"] for ref in secret_key_refs(renders["production"])}
    assert needed == set(example["stringData"])
    (local_secret,) = of_kind(renders["local"], "Secret")
    assert {ref["key"] for ref in secret_key_refs(renders["local"])} <= set(local_secret["data"])
    assert {ref["name"] for ref in secret_key_refs(renders["local"])} == {name_of(local_secret)}


# --- image -----------------------------------------------------------------------------------------


def test_dockerfile_builds_the_documented_image() -> None:
    """Python 3.11 slim, requirements installed, protos generated at build time, code at /app (the
    services and boss_common, which they import) with PYTHONPATH=/app:/app/gen, and a numeric
    non-root user matching the pods' runAsUser."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert stages and all(stage == "${PYTHON_IMAGE}" for stage in stages)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim\S*$", dockerfile, flags=re.MULTILINE)
    assert "pip install --requirement requirements.txt" in dockerfile
    assert re.search(r"^RUN (PYTHON=\S+ )?\./scripts/generate_protos\.sh$", dockerfile, flags=re.MULTILINE)
    assert "PYTHONPATH=/app:/app/gen" in dockerfile
    for package in ("boss_common", "services"):
        assert re.search(rf"^COPY {package}/ {package}/$", dockerfile, flags=re.MULTILINE)
    assert re.search(r"^WORKDIR /app$", dockerfile, flags=re.MULTILINE)
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert users and users[-1] == f"{IMAGE_USER}:{IMAGE_USER}"
