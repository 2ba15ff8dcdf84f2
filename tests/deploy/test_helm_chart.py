"""The Helm chart (deploy/helm/raypod) through Helm's own engine (helm-python-sdk binds Helm's Go SDK: no helm
binary is packaged here): `helm lint --strict`, `helm template` with several values, each rendered object read
back through the official Kubernetes client's typed models (no field unknown to Kubernetes), and RBAC that grants
exactly the verbs the Kubernetes backend uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from raypod.backends.kuberay import backend as kuberay

helm = pytest.importorskip("helm_python", reason="needs helm-python-sdk (Helm's engine): pip install -e '.[test]'")

CHART = Path(__file__).parents[2] / "deploy" / "helm" / "raypod"
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "ingress and an external database": {
        "ingress": {"enabled": True, "host": "raypod.corp.example", "className": "nginx"},
        "database": {"existingSecret": "raypod-db"},
        "observability": {"podMonitor": {"enabled": True}, "prometheusUrl": "http://prometheus:9090"},
    },
    "two namespaces only": {"watchNamespaces": ["team-a", "team-b"], "persistence": {"enabled": False}},
}
MODELS = {
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "ServiceAccount": "V1ServiceAccount",
    "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    "Ingress": "V1Ingress",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    rendered = chart.render(values, name="raypod", namespace="raypod-system", is_install=True)
    return [doc for text in rendered.values() for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_the_chart_lints_clean(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version="v1.30.0")
    assert not report.get("errors"), report
    assert [m for m in report.get("messages", []) if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_rendered_object_is_a_valid_kubernetes_object(values: dict[str, Any]) -> None:
    api = client.ApiClient()
    for doc in render(values):
        if doc["kind"] == "PodMonitor":  # prometheus-operator's CRD: its fields are checked below
            assert doc["spec"]["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
            continue
        model = api._ApiClient__deserialize(doc, MODELS[doc["kind"]])  # type: ignore[attr-defined]
        assert api.sanitize_for_serialization(model) == doc, f"{doc['kind']}: a field Kubernetes does not know"


def test_rbac_grants_exactly_what_the_backend_uses() -> None:
    for values in VARIANTS.values():
        roles = [d for d in render(values) if d["kind"] in ("ClusterRole", "Role")]
        cluster_scoped = [r for r in roles if r["metadata"]["name"].endswith("-cluster")]
        assert [r["rules"] for r in cluster_scoped] == [[kuberay.CRD_RULE, kuberay.NODE_RULE]]
        others = [r for r in roles if r not in cluster_scoped]
        assert others
        for role in others:
            assert role["rules"] == list(kuberay.RBAC_RULES)
    namespaced = [d for d in render(VARIANTS["two namespaces only"]) if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in namespaced) == ["team-a", "team-b"]


def test_state_is_a_volume_claim_unless_an_external_database_is_named() -> None:
    kinds = {d["kind"] for d in render({})}
    assert "PersistentVolumeClaim" in kinds
    external = render(VARIANTS["ingress and an external database"])
    assert "PersistentVolumeClaim" not in {d["kind"] for d in external}
    [deployment] = [d for d in external if d["kind"] == "Deployment"]
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RAYPOD_BACKEND"]["value"] == "kuberay"
    assert env["RAYPOD_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "raypod-db", "key": "database-url"}
    assert env["RAYPOD_SERVER"]["value"] == "https://raypod.corp.example"
    [ingress] = [d for d in external if d["kind"] == "Ingress"]
    assert ingress["spec"]["tls"][0]["hosts"] == ["raypod.corp.example"]
