#!/usr/bin/env python3
"""Checks that every example's claims allocate the way its README says, without a cluster.

Two mock nodes are rendered with `tessera inventory` (the devices the node plugin would publish):
`node-dgx-h100` and `node-hgx-a100-mig`, the topologies deploy/kind gives its workers. Each
ResourceClaim of an example, a claim made from each ResourceClaimTemplate, and the claim
kube-scheduler makes for a pod's extended resources (`nvidia.com/gpu: 2`), is then explained
with `tessera explain` (the allocator the controller uses; first fit is what kube-scheduler does)
and its allocation compared with the expectation below. Every claim of every example needs an
expectation, so a new example cannot skip this check. A claim whose expectation names a
`sharing` mode is explained against one dgx-h100 node published with that consumable-shares mode
(`tessera inventory --consumable-shares`), as the e2e suite switches a node before applying it.

usage: check-example-allocations.py --tessera PATH EXAMPLES_DIR DEVICECLASSES_FILE
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError as missing:
    sys.exit(f"check-example-allocations: {missing}; install with `python3 -m pip install pyyaml`")

NODES = {"node-dgx-h100": "dgx-h100", "node-hgx-a100-mig": "hgx-a100-mig"}

# "<example>/<claim or template name>" -> what its allocation must look like:
#   results: number of results ("all-gpus-of-node": every whole GPU of the chosen node)
#   device: regex every device name matches;  node: the node chosen;  request: every result's request
#   same: attributes (gpu.tessera.dev, or fully qualified) equal across the results;
#   drivers: the drivers of the results, in order;  config: sharing strategy of a
#   FromClaim config;  admin: every result has adminAccess;  mode: explain mode (default first-fit)
#   sharing: the consumable-shares mode of the one node it is explained against
#   consumed: {capacity: quantity} every result must consume
EXPECTATIONS = {
    "single-gpu/single-gpu": {"results": 1, "device": r"^gpu-\d+$"},
    "nvlink-pair/nvlink-pair": {"results": 2, "device": r"^gpu-\d+$", "same": ["nvlinkIsland"]},
    "mig-slice/mig-slice": {"results": 1, "device": r"^gpu-\d+-mig-1g-", "node": "node-hgx-a100-mig"},
    "cel-selectors/big-h100": {"results": 1, "device": r"^gpu-\d+$", "node": "node-dgx-h100"},
    "shared-claim/shared-gpu": {"results": 1, "device": r"^gpu-\d+$"},
    "time-slicing/time-sliced-gpu": {"results": 1, "config": "TimeSlicing"},
    "mps/mps-gpu": {"results": 1, "config": "MPS"},
    "nvidia-mps/shared-gpu": {"results": 1, "config": "MPS"},
    "nvidia-quickstart/single-gpu": {"results": 1, "device": r"^gpu-\d+$"},
    "nvidia-selectors/inference-gpu": {"results": 1, "device": r"^gpu-\d+$"},
    "nvidia-selectors/training-gpus": {
        "results": 2,
        "device": r"^gpu-\d+$",
        "node": "node-dgx-h100",
        "same": ["productName", "architecture"],
    },
    "nvidia-shares-integer/gpu-1share": {
        "sharing": "4",
        "results": 1,
        "device": r"^gpu-\d+$",
        "consumed": {"shares": "1"},
    },
    "nvidia-shares-memory/gpu-4gi": {
        "sharing": "memory",
        "results": 1,
        "device": r"^gpu-\d+$",
        "consumed": {"memory": "4Gi"},
    },
    "prioritized-list/best-available": {"results": 1, "request": "gpu/h100", "node": "node-dgx-h100"},
    "admin-access/all-gpus-admin": {"results": "all-gpus-of-node", "admin": True},
    # The quota's four GPUs (over-quota/ sits outside the example's applied manifests).
    "gpu-quota/four-gpus": {"results": 4, "device": r"^gpu-\d+$"},
    # The scavenger's batch pods are gated: the controller places each on one managed GPU
    # (production/ sits outside the example's applied manifests).
    "scavenger/one-gpu": {"mode": "topology-aware", "results": 1, "device": r"^gpu-\d+$"},
    "topology-aware/four-gpus": {
        "mode": "topology-aware",
        "results": 4,
        "device": r"^gpu-\d+$",
        "same": ["nvlinkIsland", "numaNode"],
    },
    # A GPU and a NIC of another driver (the example's stand-in slice) lined up on standard names.
    "gpu-nic-aligned/same-root": {
        "results": 2,
        "drivers": ["gpu.tessera.dev", "nic.example.com"],
        "node": "node-dgx-h100",
        "same": ["resource.kubernetes.io/pcieRoot"],
    },
    "gpu-nic-aligned/same-numa-node": {
        "results": 2,
        "drivers": ["gpu.tessera.dev", "nic.example.com"],
        "node": "node-dgx-h100",
        "same": ["resource.kubernetes.io/numaNode"],
    },
    # Allocated like any claim: the plugin refuses the config only when it prepares the claim.
    "invalid-config/bad-interval": {"results": 1, "config": "TimeSlicing"},
    # Claims kube-scheduler makes for a pod's extended resources (see extended_resource_claim).
    "extended-resource-gpu/pod-extended-resources": {
        "results": 2,
        "device": r"^gpu-\d+$",
        "request": "container-0-request-0",
    },
    "extended-resource-mig/pod-extended-resources": {
        "results": 1,
        "device": r"^gpu-\d+-mig-1g-10gb-\d+$",
        "node": "node-hgx-a100-mig",
        "request": "container-0-request-0",
    },
}

# Names that are not extended resources: unprefixed ones and those in *kubernetes.io/.
def is_extended_resource(name):
    return "/" in name and "kubernetes.io/" not in name


def extended_resource_claim(pod, classes):
    """The claim kube-scheduler (v1.37) makes for a pod's extended resources backed by DRA, or
    None: one request per container and resource, named `container-<index>-request-<index of
    the resource among the container's sorted request names>`, for the class whose
    `extendedResourceName` (or implicit `deviceclass.resource.kubernetes.io/<class>`) it is.
    Only what the examples use: regular containers, limits standing in for requests."""
    by_name = {}
    for cls in classes:
        by_name[f"deviceclass.resource.kubernetes.io/{cls['metadata']['name']}"] = cls["metadata"]["name"]
        if (cls.get("spec") or {}).get("extendedResourceName"):
            by_name[cls["spec"]["extendedResourceName"]] = cls["metadata"]["name"]
    spec = pod.get("spec") or {}
    init = spec.get("initContainers") or []
    requests = []
    for index, container in enumerate(init + (spec.get("containers") or [])):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name in sorted(wanted):
            if is_extended_resource(name) and name in by_name and int(wanted[name]) > 0:
                requests.append({
                    "name": f"container-{index}-request-{sorted(wanted).index(name)}",
                    "exactly": {"deviceClassName": by_name[name], "allocationMode": "ExactCount",
                                "count": int(wanted[name])},
                })
    if not requests:
        return None
    meta = pod["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": meta["namespace"], "name": f"{meta['name']}-extended-resources",
                     "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": sorted(requests, key=lambda r: r["name"])}},
    }


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def example_claims(examples_dir, classes):
    """Yields (key, claim object) for every claim and claim template of every example, and for
    the claim kube-scheduler would make for each pod's extended resources."""
    for example in sorted(os.listdir(examples_dir)):
        directory = os.path.join(examples_dir, example)
        if not os.path.isdir(directory):
            continue
        for file in sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml"))):
            with open(os.path.join(directory, file), encoding="utf-8") as f:
                for doc in yaml.safe_load_all(f):
                    if doc and doc.get("kind") == "Pod":
                        claim = extended_resource_claim(doc, classes)
                        if claim is not None:
                            yield f"{example}/{claim['metadata']['name']}", claim
                        continue
                    if not doc or doc.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                        continue
                    meta = doc["metadata"]
                    spec = doc["spec"] if doc["kind"] == "ResourceClaim" else doc["spec"]["spec"]
                    claim = {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {"namespace": meta["namespace"], "name": meta["name"]},
                        "spec": spec,
                    }
                    yield f"{example}/{meta['name']}", claim


def device_attributes(slice_files):
    """(pool, device) -> {attribute name: value} for the gpu.tessera.dev attributes."""
    found = {}
    for path in slice_files:
        with open(path, encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "ResourceSlice":
                    continue
                pool = doc["spec"]["pool"]["name"]
                for device in doc["spec"].get("devices") or []:
                    values = {}
                    for name, value in (device.get("attributes") or {}).items():
                        values[name.removeprefix("gpu.tessera.dev/")] = next(iter(value.values()))
                    found[(pool, device["name"])] = values
    return found


def check(key, expected, explained, attributes):
    """Yields the differences between an explained allocation and its expectation."""
    allocation = explained.get("allocation")
    if not allocation:
        reasons = json.dumps(explained.get("unsatisfiable"))
        yield f"cannot be allocated: {reasons}"
        return
    node = explained.get("node")
    results = allocation["devices"]["results"]
    want = expected["results"]
    if want == "all-gpus-of-node":
        want = sum(1 for (pool, _), a in attributes.items() if pool == node and a.get("type") == "gpu")
    if len(results) != want:
        yield f"{len(results)} results, expected {want}: {[r['device'] for r in results]}"
    if "drivers" in expected and [r["driver"] for r in results] != expected["drivers"]:
        yield f"drivers {[r['driver'] for r in results]}, expected {expected['drivers']}"
    if "node" in expected and node != expected["node"]:
        yield f"allocated on {node}, expected {expected['node']}"
    for result in results:
        if "device" in expected and not re.search(expected["device"], result["device"]):
            yield f"device {result['device']} does not match {expected['device']}"
        if "request" in expected and result["request"] != expected["request"]:
            yield f"result for request {result['request']}, expected {expected['request']}"
        if expected.get("admin") and not result.get("adminAccess"):
            yield f"device {result['device']} lacks adminAccess"
        for name, quantity in (expected.get("consumed") or {}).items():
            got = (result.get("consumedCapacity") or {}).get(name)
            if got != quantity:
                yield f"device {result['device']} consumed {name} {got!r}, expected {quantity!r}"
    for name in expected.get("same", []):
        values = {attributes.get((r["pool"], r["device"]), {}).get(name) for r in results}
        if len(values) != 1 or None in values:
            yield f"results differ in (or lack) attribute {name}: {sorted(map(str, values))}"
    if "config" in expected:
        strategies = [
            ((c.get("opaque") or {}).get("parameters") or {}).get("sharing", {}).get("strategy")
            for c in allocation["devices"].get("config") or []
            if c.get("source") == "FromClaim"
        ]
        if strategies != [expected["config"]]:
            yield f"FromClaim config strategies {strategies}, expected [{expected['config']}]"


def example_objects(examples_dir):
    """The DeviceClasses and ResourceSlices examples bring with them (stand-ins for other drivers)."""
    found = []
    for example in sorted(os.listdir(examples_dir)):
        directory = os.path.join(examples_dir, example)
        if not os.path.isdir(directory):
            continue
        for file in sorted(f for f in os.listdir(directory) if f.endswith((".yaml", ".yml"))):
            with open(os.path.join(directory, file), encoding="utf-8") as f:
                found += [d for d in yaml.safe_load_all(f) if d and d.get("kind") in ("DeviceClass", "ResourceSlice")]
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tessera", required=True, help="the tessera binary")
    parser.add_argument("examples")
    parser.add_argument("deviceclasses")
    args = parser.parse_args()

    with open(args.deviceclasses, encoding="utf-8") as f:
        classes = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "DeviceClass"]
    claims = list(example_claims(args.examples, classes))
    problems = [f"{key}: no expectation in {__file__}" for key, _ in claims if key not in EXPECTATIONS]
    problems += [f"{key}: expected, but no example creates it" for key in EXPECTATIONS if key not in dict(claims)]

    def objects_dir(parent, name, nodes):
        """A directory of objects for `tessera explain`: the nodes' slices (node -> (topology,
        consumable-shares mode)), the chart's DeviceClasses and every claim."""
        objects = os.path.join(parent, name)
        os.mkdir(objects)
        slice_files = []
        for node, (topology, sharing) in nodes.items():
            path = os.path.join(objects, f"slices-{node}.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(run([args.tessera, "inventory", "--topology", topology, "--node-name", node,
                             "--consumable-shares", sharing, "-o", "yaml"]))
            slice_files.append(path)
        extra = example_objects(args.examples)
        if extra:
            path = os.path.join(objects, "example-objects.yaml")
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump_all(extra, f)
            slice_files.append(path)
        with open(os.path.join(objects, "deviceclasses.yaml"), "w", encoding="utf-8") as f:
            f.write(open(args.deviceclasses, encoding="utf-8").read())
        with open(os.path.join(objects, "claims.yaml"), "w", encoding="utf-8") as f:
            yaml.safe_dump_all([claim for _, claim in claims], f)
        return objects, device_attributes(slice_files)

    with tempfile.TemporaryDirectory() as parent:
        exclusive = objects_dir(parent, "exclusive", {n: (t, "disabled") for n, t in NODES.items()})
        shared = {}

        for key, claim in claims:
            expected = EXPECTATIONS.get(key)
            if expected is None:
                continue
            sharing = expected.get("sharing")
            if sharing is None:
                objects, attributes = exclusive
            else:
                if sharing not in shared:
                    shared[sharing] = objects_dir(parent, f"shared-{sharing}",
                                                  {"node-dgx-h100-shared": ("dgx-h100", sharing)})
                objects, attributes = shared[sharing]
            target = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
            mode = expected.get("mode", "first-fit")
            try:
                explained = json.loads(run([args.tessera, "explain", "--objects", objects,
                                            "--claim", target, "--mode", mode, "-o", "json"]))
            except (RuntimeError, json.JSONDecodeError) as err:
                problems.append(f"{key}: {err}")
                continue
            found = [f"{key} ({mode}): {p}" for p in check(key, expected, explained, attributes)]
            problems += found
            if not found:
                devices = ", ".join(r["device"] for r in explained["allocation"]["devices"]["results"])
                print(f"as expected: {key} ({mode}) -> {explained['node']}: {devices}")

    for problem in problems:
        print(f"FAIL: {problem}")
    if problems:
        print(f"check-example-allocations: {len(problems)} problem(s)")
        return 1
    print(f"check-example-allocations: {len(claims)} claim(s) allocate as their READMEs say")
    return 0


if __name__ == "__main__":
    sys.exit(main())
