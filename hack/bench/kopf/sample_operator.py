"""The Nuvolaris training's Sample operator, written with kopf, as the
benchmark's peer (hack/bench/sample --kopf).

It does what kustomize-operator does for a Sample, the way the training's
Python operator did it: one overlay directory per Sample over the same base
(kustomize/sample/base), `kubectl apply -k` of it, kubectl's output recorded
in the Sample's status; `kubectl delete -k` when the Sample goes. Its status
uses the fields of the Sample CRD's schema, so the benchmark waits for the
same `Ready` condition for both operators.

    SAMPLE_BASE=kustomize/sample/base kopf run --standalone --all-namespaces sample_operator.py
"""

import asyncio
import datetime
import os
import pathlib
import shutil
import tempfile

import kopf

BASE = pathlib.Path(os.environ["SAMPLE_BASE"])
KUBECTL = os.environ.get("KUBECTL", "kubectl")

KUSTOMIZATION = """apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: {namespace}
resources: [base]
labels:
  - pairs: {{app.kubernetes.io/instance: "{name}"}}
    includeSelectors: true
    includeTemplates: true
patches:
  - path: patch.yaml
    target: {{kind: Deployment, name: nginx}}
"""

PATCH = """- op: replace
  path: /metadata/name
  value: "{name}"
- op: replace
  path: /spec/replicas
  value: {count}
"""


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.execution.max_workers = 32
    settings.persistence.finalizer = "nuvolaris.org/kopf-sample"


async def kubectl(verb, name, namespace, count):
    """Writes the Sample's overlay to a temp dir and runs `kubectl <verb> -k` on it."""
    with tempfile.TemporaryDirectory(prefix="kopf-sample-") as tmp:
        d = pathlib.Path(tmp)
        shutil.copytree(BASE, d / "base")
        (d / "kustomization.yaml").write_text(KUSTOMIZATION.format(namespace=namespace, name=name))
        (d / "patch.yaml").write_text(PATCH.format(name=name, count=count))
        proc = await asyncio.create_subprocess_exec(
            KUBECTL, verb, "-k", str(d),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode, out.decode(), err.decode()


@kopf.on.create("nuvolaris.org", "v1", "samples")
@kopf.on.update("nuvolaris.org", "v1", "samples", field="spec")
async def apply(spec, name, namespace, meta, patch, **_):
    code, out, err = await kubectl("apply", name, namespace, spec.get("count", 1))
    if code != 0:
        raise kopf.TemporaryError(f"kubectl apply -k failed: {err.strip()}", delay=5)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch.status["observedGeneration"] = meta.get("generation")
    patch.status["message"] = out.strip().splitlines()[0] if out.strip() else ""
    patch.status["conditions"] = [{
        "type": "Ready", "status": "True", "reason": "Applied", "message": out.strip()[:1000],
        "lastTransitionTime": now, "observedGeneration": meta.get("generation"),
    }]


@kopf.on.delete("nuvolaris.org", "v1", "samples")
async def delete(spec, name, namespace, **_):
    code, _out, err = await kubectl("delete", name, namespace, spec.get("count", 1))
    if code != 0 and "NotFound" not in err:
        raise kopf.TemporaryError(f"kubectl delete -k failed: {err.strip()}", delay=5)
