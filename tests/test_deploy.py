"""The Kubernetes manifests under ``deploy/``: every overlay renders with ``kubectl kustomize`` and what it renders
runs the real service: every explainq command parses with the CLI's own parser, every variable is a setting the
service reads, the API's probes are its unauthenticated ``/livez`` and ``/readyz`` on the port it listens on, each
worker's ``--threads`` is its CPU request, the GPU class requests a GPU on GPU nodes, every Secret reference names a
key of the example Secret, and each worker class's KEDA ScaledObject reads the backlog keys the code writes
(``core.backlog.scaler_keys``) for exactly the queues its Deployment serves."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from core import placement
from core.backlog import scaler_keys
from core.contract.kind import QUEUES
from core.settings import Settings
from explainq.cli import build_parser
from tests.service import ROOT

DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").exists())
SECRET = "explainq"
KUBECTL = shutil.which("kubectl")
# Variables read by libraries rather than by core/settings.py: s3fs's credentials and endpoint.
LIBRARY_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: the overlays cannot be "
                                   "rendered (`kubectl kustomize` renders them offline)")


def render(overlay: Path) -> list[dict[str, Any]]:
    out = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every workload."""
    return [(d, c) for d in docs if d["kind"] in ("Deployment", "StatefulSet", "CronJob")
            for c in pod_spec(d)["containers"]]


def explainq_args(container: dict[str, Any]):
    """The container's command parsed by the CLI's own parser (None for a container that does not run explainq)."""
    command = container.get("command") or []
    if not command or command[0] != "explainq":
        return None
    return build_parser().parse_args(command[1:])


def cpu_cores(quantity: str) -> float:
    q = str(quantity)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def settings_names() -> set[str]:
    names = set()
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        for choice in getattr(alias, "choices", []):
            if isinstance(choice, str) and choice.isupper():
                names.add(choice)
    return names


def worker_classes_of(docs: list[dict[str, Any]]) -> dict[str, placement.WorkerClass]:
    """The worker classes of the rendered ConfigMap, as the service parses them (a bad table fails here)."""
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "EXPLAINQ_WORKER_CLASSES" in d["data"]]
    return placement.worker_classes(Settings(EXPLAINQ_WORKER_CLASSES=config["data"]["EXPLAINQ_WORKER_CLASSES"]))


def example_secret() -> dict[str, str]:
    doc = yaml.safe_load((DEPLOY / "secret.example.yaml").read_text())
    assert doc["kind"] == "Secret" and doc["metadata"]["name"] == SECRET
    return doc["stringData"]


def test_there_are_the_overlays_the_docs_name():
    assert {p.name for p in OVERLAYS} == {"cpu-only", "gpu", "external-redis"}
    ops = (ROOT / "docs" / "operations.md").read_text()
    for p in OVERLAYS:
        assert f"deploy/overlays/{p.name}" in ops, p.name


def test_the_example_secret_holds_no_credential():
    for key, value in example_secret().items():
        assert "CHANGE-ME" in value or value.endswith("example.com") or key == "redis-address", (key, value)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_command_and_variable_is_the_services_own(overlay):
    docs = render(overlay)
    known = settings_names() | LIBRARY_ENV
    configmaps = by_kind(docs, "ConfigMap")
    ran = set()
    for workload, c in containers(docs):
        args = explainq_args(c)
        if args is None:
            continue
        ran.add(args.command)
        names = {e["name"] for e in c.get("env", [])}
        for source in c.get("envFrom", []):
            names |= set(configmaps[source["configMapRef"]["name"]]["data"])
        assert names <= known, (workload["metadata"]["name"], sorted(names - known))
        assert {"REDIS_URL", "EXPLAINQ_STORE", "EXPLAINQ_HOME"} <= names, workload["metadata"]["name"]
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        home = next(cm["data"]["EXPLAINQ_HOME"] for cm in configmaps.values() if "EXPLAINQ_HOME" in cm["data"])
        assert home in mounts, workload["metadata"]["name"]
    assert ran == {"api", "worker", "gc"}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_the_api_is_probed_on_livez_and_readyz_where_it_listens(overlay):
    docs = render(overlay)
    api = by_kind(docs, "Deployment")["explainq-api"]
    (c,) = pod_spec(api)["containers"]
    args = explainq_args(c)
    assert args.command == "api" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}

    def port_of(ref):
        return ports[ref] if isinstance(ref, str) else ref

    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_of(get["port"]) == args.port, probe
        assert "httpHeaders" not in get, probe  # the probes need no key
        assert c[probe]["timeoutSeconds"] >= 2, probe
    service = by_kind(docs, "Service")["explainq-api"]
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    assert [port_of(p["targetPort"]) for p in service["spec"]["ports"]] == [args.port]
    assert "EXPLAINQ_API_KEYS" in {e["name"] for e in c["env"]}  # it listens on all interfaces: keys required


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_workers_threads_match_their_cpu_request_and_the_gpu_class_gets_a_gpu(overlay):
    docs = render(overlay)
    workers = {}
    for name, d in by_kind(docs, "Deployment").items():
        (c,) = pod_spec(d)["containers"]
        args = explainq_args(c)
        if args.command != "worker":
            continue
        workers[name] = (d, c, args)
        queues = args.queues.split(",")
        assert set(queues) <= set(QUEUES), (name, queues)
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert args.threads == cpu_cores(requests["cpu"]), name
        assert "memory" in requests and "memory" in limits, name
        assert d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60, name
    served = sorted(q for _, _, args in workers.values() for q in args.queues.split(","))
    assert served == sorted(QUEUES)  # every queue has exactly one worker class
    classes = worker_classes_of(docs)
    for name, (_, _, args) in workers.items():  # each worker joins a class of the table, for the class's queues
        assert args.worker_class in classes, (name, args.worker_class)
        assert args.queues.split(",") == list(classes[args.worker_class].queues), name
    assert not classes["explain"].gpu
    if overlay.name == "gpu":  # the two-class example: CPU explain workers, GPU train workers
        assert classes["train"].gpu and classes["train"].gpu_memory_bytes >= 16 * placement.GIB
    else:
        assert not classes["train"].gpu
    train, train_c, _ = workers["explainq-worker-train"]
    explain, explain_c, _ = workers["explainq-worker-explain"]
    assert "nvidia.com/gpu" not in str(explain_c["resources"]) and "nodeSelector" not in pod_spec(explain)
    gpu = train_c["resources"]["limits"].get("nvidia.com/gpu")
    if overlay.name == "gpu":
        assert int(gpu) >= 1 and train_c["resources"]["requests"]["nvidia.com/gpu"] == gpu
        assert pod_spec(train)["nodeSelector"]
        assert any(t["key"] == "nvidia.com/gpu" for t in pod_spec(train)["tolerations"])
        assert train_c["image"].endswith(":cuda")
    else:
        assert gpu is None and "nodeSelector" not in pod_spec(train)
        assert not train_c["image"].endswith(":cuda")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_secret_reference_names_a_key_of_the_example_secret(overlay):
    docs = render(overlay)
    keys = set(example_secret())
    refs = []
    for workload, c in containers(docs):
        for e in c.get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.append((workload["metadata"]["name"], e["name"], ref))
        assert not any("secretRef" in s for s in c.get("envFrom", [])), "every secret is named one by one"
    for auth in by_kind(docs, "TriggerAuthentication").values():
        for ref in auth["spec"]["secretTargetRef"]:
            refs.append((auth["metadata"]["name"], ref["parameter"], ref))
    assert refs
    for where, name, ref in refs:
        assert ref["name"] == SECRET and ref["key"] in keys, (where, name, ref)
    assert not by_kind(docs, "Secret"), "no overlay ships a Secret: it is the operator's"
    # no value that belongs in the Secret is written in the manifests
    text = yaml.safe_dump_all(docs)
    assert not re.search(r"redis://[^\s\"']*@", text)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_redis_keeps_an_append_only_file_on_a_volume_unless_external(overlay):
    docs = render(overlay)
    sets = by_kind(docs, "StatefulSet")
    if overlay.name == "external-redis":
        assert not sets and "explainq-redis" not in by_kind(docs, "Service")
        return
    redis = sets["explainq-redis"]
    (c,) = pod_spec(redis)["containers"]
    line = shlex.split(c["command"][-1])
    assert line[:2] == ["exec", "redis-server"]
    assert line[line.index("--appendonly") + 1] == "yes"
    assert "--requirepass" in line
    data_dir = line[line.index("--dir") + 1]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": data_dir} in c["volumeMounts"]
    service = by_kind(docs, "Service")["explainq-redis"]
    assert redis["spec"]["serviceName"] == "explainq-redis"
    assert service["spec"]["selector"] == redis["spec"]["selector"]["matchLabels"]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_each_worker_class_scales_on_the_backlog_the_code_publishes(overlay):
    docs = render(overlay)
    deployments = by_kind(docs, "Deployment")
    auths = by_kind(docs, "TriggerAuthentication")
    scaled = by_kind(docs, "ScaledObject")
    worker_names = {n for n, d in deployments.items() if explainq_args(pod_spec(d)["containers"][0]).command == "worker"}
    targets = {so["spec"]["scaleTargetRef"]["name"] for so in scaled.values()}
    assert targets == worker_names  # one per worker class, none for the API
    for so in scaled.values():
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        args = explainq_args(pod_spec(target)["containers"][0])
        classes = worker_classes_of(docs)
        served = placement.serving_queues(classes[args.worker_class], args.queues.split(","))
        want = {f"{q.replace(placement.SEPARATOR + args.worker_class, '_at')}_{part}": key
                for q in served for part, key in scaler_keys(q).items()}
        triggers = {t["name"]: t for t in so["spec"]["triggers"]}
        assert {n: t["metadata"]["listName"] for n, t in triggers.items()} == want, so["metadata"]["name"]
        for t in triggers.values():
            assert t["type"] == "redis"
            assert t["authenticationRef"]["name"] in auths
        modifiers = so["spec"]["advanced"]["scalingModifiers"]
        terms = [term.strip() for term in modifiers["formula"].split("+")]
        assert sorted(terms) == sorted(want), modifiers["formula"]  # the sum of every trigger, each once
        assert float(modifiers["target"]) > 0
        assert so["spec"]["maxReplicaCount"] >= max(1, so["spec"].get("minReplicaCount", 0))


# Kubernetes's own schemas, bundled by kubernetes-validate (offline): every rendered object of the built-in API is
# valid for the oldest Kubernetes the manifests support, strictly (a misspelt field is an error). KEDA's objects
# have no bundled schema; their fields are checked against the code above.
K8S_VERSION = "1.28.0"
CRD_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("keda.sh/v1alpha1", "TriggerAuthentication")}


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_rendered_object_is_valid_for_the_kubernetes_api(overlay):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra)")
    docs = render(overlay)
    validated = 0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            with pytest.raises(kv.utils.SchemaNotFoundError):
                kv.validate(doc, K8S_VERSION, strict=True)
            continue
        kv.validate(doc, K8S_VERSION, strict=True)
        validated += 1
    assert validated >= 6, validated  # the config, the API with its Service, two worker classes, gc


def test_the_schema_check_catches_a_misspelt_field():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra)")
    doc = yaml.safe_load((DEPLOY / "base" / "workers.yaml").read_text().split("\n---\n")[0])
    kv.validate(doc, K8S_VERSION, strict=True)
    doc["spec"]["template"]["spec"]["containers"][0]["resource"] = doc["spec"]["template"]["spec"]["containers"][0].pop(
        "resources")
    with pytest.raises(kv.ValidationError, match="resource"):
        kv.validate(doc, K8S_VERSION, strict=True)
