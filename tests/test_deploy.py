"""deploy/: the Kubernetes manifests validate against the Kubernetes schemas (the
`kubernetes-validate` package, offline) and agree with the service they run: real options,
the probes on the endpoints that exist, a grace period that outlasts the drain, the HPA's
metric one /metrics exports; the Dockerfiles start the service with real options.

A cluster and image builds cannot run here; these checks are what CI can do instead."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from realtime.config import parse_args
from realtime.metrics import Capacity, Metrics
from realtime.services import CUT_GRACE_S

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.30.0", "1.37.0")  # the oldest with the preStop sleep action on by default; the newest schemas


def documents() -> list[tuple[str, dict]]:
    return [(f.name, doc) for f in sorted(K8S.glob("*.yaml")) if f.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(f.read_text()) if doc]


def kind(name: str) -> dict:
    return next(doc for _, doc in documents() if doc["kind"] == name)


def container() -> dict:
    return kind("Deployment")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version):
    docs = documents()
    assert {d["kind"] for _, d in docs} >= {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                                            "PersistentVolumeClaim", "Namespace"}
    for name, doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the field and the reason


def test_the_validator_catches_a_wrong_field():
    broken = copy.deepcopy(kind("Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = broken["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest_and_wires_the_image_and_keys():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(f.name for f in K8S.glob("*.yaml") if f.name != "kustomization.yaml")
    assert [i["name"] for i in k["images"]] == [container()["image"]]
    secret = k["secretGenerator"][0]
    ref = next(e for e in container()["env"] if e["name"] == "REALTIME_API_KEYS")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["name"], "key": secret["files"][0]}
    assert (K8S / ".gitignore").read_text().split() == [secret["files"][0]]  # keys are never committed


def test_the_deployment_runs_real_options_and_outlasts_its_drain():
    c, pod = container(), kind("Deployment")["spec"]["template"]["spec"]
    config = parse_args(c["args"])  # a wrong option fails here, as it would in the pod
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and config.device == "cuda"
    assert c["startupProbe"]["httpGet"]["path"] == c["livenessProbe"]["httpGet"]["path"] == "/v1/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/ready"
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + config.drain_timeout_s + CUT_GRACE_S
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace  # /v1/health says 503 while draining
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert str(config.voices_dir) == "voices" and "--voices-dir" not in c["args"]  # the image's entrypoint sets it
    assert mounts["voices"] == "/data/voices" and config.model.startswith(mounts["models"])
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
    modes = {d["metadata"]["name"]: d["spec"]["accessModes"] for _, d in documents()
             if d["kind"] == "PersistentVolumeClaim"}
    assert modes[claims["voices"]] == ["ReadWriteMany"]  # every replica stores and reads voices


def test_the_autoscaler_scales_on_a_metric_the_service_exports():
    metric = kind("HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    text = Metrics().render({}, Capacity(ready=True, used=0.5, kv_free=0.5))
    assert re.search(rf"^# TYPE {metric} gauge$", text, re.M)
    adapter = yaml.safe_load((ROOT / "deploy" / "prometheus-adapter" / "values.yaml").read_text())
    rule = adapter["rules"]["custom"][0]
    assert rule["seriesQuery"].startswith(metric + "{") and rule["name"]["as"] == metric


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_the_dockerfiles_start_the_service_with_real_options(dockerfile):
    text = (ROOT / "deploy" / dockerfile).read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)[1])
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M)[1])
    assert entry[:3] == ["python", "-m", "realtime"]
    config = parse_args(entry[3:] + cmd)
    assert config.host == "0.0.0.0" and str(config.voices_dir) == "/data/voices"
    assert config.device == ("cpu" if dockerfile.endswith(".cpu") else "cuda")
    config = parse_args(entry[3:] + container()["args"])  # the Deployment's args replace CMD
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.M) for s in line.split()[:-1]]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    ignore = (ROOT / "deploy" / f"{dockerfile}.dockerignore").read_text()
    assert {f"!{s}" for s in sources} <= set(ignore.split())  # in the build context
    assert "torch==2.13.0" in text  # the pin of pyproject.toml


def test_deploy_readme_shows_the_haproxy_config_the_launcher_writes():
    from realtime.replicas import haproxy_config

    readme = (ROOT / "deploy" / "README.md").read_text()
    shown = re.search(r"```\n(defaults\n.*?)```", readme, re.S)[1]
    written = haproxy_config("127.0.0.1", 8765, [("127.0.0.1", 8766), ("127.0.0.1", 8767)])

    def directives(text: str) -> list[str]:
        lines = (" ".join(line.split("#")[0].split()) for line in text.splitlines())
        return [line for line in lines if line]

    assert directives(shown) == directives("defaults" + written.split("defaults", 1)[1])  # its header left out
