#!/usr/bin/env python3
"""Checks the conventions deploy/examples keeps, so each example stays a self-contained e2e fixture.

- every example directory has a README.md and at least one manifest, and the index links it;
- its manifests create the namespace `tessera-example-<directory>` and put every namespaced
  object there (so examples never collide and deleting the namespace cleans up);
- DRA objects use resource.k8s.io/v1;
- every claim a pod or container names exists: pod claims point at a claim or template of the
  example, container claims at a pod claim, and a container's `request` at a request of it.

usage: check-examples.py EXAMPLES_DIR
"""

import os
import sys

try:
    import yaml
except ImportError as missing:
    sys.exit(f"check-examples: {missing}; install with `python3 -m pip install pyyaml`")

CLUSTER_SCOPED = {"Namespace", "DeviceClass", "ResourceSlice", "DeviceTaintRule", "PriorityClass"}


def request_names(claim_spec):
    return {r.get("name") for r in ((claim_spec or {}).get("devices") or {}).get("requests") or []}


def check_pod(pod, claims, templates):
    """Yields the problems of one pod's claim references."""
    spec = pod.get("spec") or {}
    pod_claims = {}
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("name")
        if entry.get("resourceClaimName"):
            target = claims.get(entry["resourceClaimName"])
            what = f"ResourceClaim {entry['resourceClaimName']}"
        else:
            target = templates.get(entry.get("resourceClaimTemplateName"))
            what = f"ResourceClaimTemplate {entry.get('resourceClaimTemplateName')}"
        if target is None:
            yield f"pod claim `{name}` refers to {what}, which the example does not create"
        pod_claims[name] = request_names(target) if target is not None else None
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    for container in containers:
        for ref in (container.get("resources") or {}).get("claims") or []:
            if ref.get("name") not in pod_claims:
                yield f"container `{container.get('name')}` uses claim `{ref.get('name')}`, which is not in spec.resourceClaims"
                continue
            requests = pod_claims[ref["name"]]
            if requests is not None and ref.get("request") and ref["request"] not in requests:
                yield f"container `{container.get('name')}` uses request `{ref['request']}` of claim `{ref.get('name')}`, which has requests {sorted(requests)}"


def check_example(directory, name):
    """Yields the problems of one example directory."""
    files = sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml")))
    if not os.path.isfile(os.path.join(directory, "README.md")):
        yield "has no README.md"
    if not files:
        yield "has no manifests"
        return
    namespace = f"tessera-example-{name}"
    docs = []
    for file in files:
        with open(os.path.join(directory, file), encoding="utf-8") as f:
            docs += [(file, d) for d in yaml.safe_load_all(f) if d is not None]
    if not any(d.get("kind") == "Namespace" and (d.get("metadata") or {}).get("name") == namespace for _, d in docs):
        yield f"does not create its namespace {namespace}"
    claims, templates = {}, {}
    for file, doc in docs:
        kind, meta = doc.get("kind"), doc.get("metadata") or {}
        label = f"{file}: {kind} {meta.get('name')}"
        if doc.get("apiVersion", "").startswith("resource.k8s.io/") and doc["apiVersion"] != "resource.k8s.io/v1":
            yield f"{label}: uses {doc['apiVersion']}; examples use resource.k8s.io/v1"
        if kind not in CLUSTER_SCOPED and meta.get("namespace") != namespace:
            yield f"{label}: is in namespace {meta.get('namespace')!r}, not {namespace}"
        if kind == "ResourceClaim":
            claims[meta.get("name")] = doc.get("spec")
        elif kind == "ResourceClaimTemplate":
            templates[meta.get("name")] = (doc.get("spec") or {}).get("spec")
    for file, doc in docs:
        if doc.get("kind") == "Pod":
            for problem in check_pod(doc, claims, templates):
                yield f"{file}: Pod {(doc.get('metadata') or {}).get('name')}: {problem}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    root = sys.argv[1]
    index_path = os.path.join(root, "README.md")
    index = open(index_path, encoding="utf-8").read() if os.path.isfile(index_path) else ""
    problems = 0
    examples = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for name in examples:
        found = list(check_example(os.path.join(root, name), name))
        if f"]({name}/)" not in index:
            found.append(f"is not linked from {index_path} as `]({name}/)`")
        for problem in found:
            print(f"{root}/{name}: {problem}")
        problems += len(found)
    if problems:
        print(f"check-examples: {problems} problem(s)")
        return 1
    print(f"check-examples: {len(examples)} example(s) follow the conventions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
