#!/usr/bin/env python3
"""Prints what Tessera did for the pods of one namespace of the local cluster: each pod's node,
each claim's allocated devices with their published attributes, and what each container got.
On containerd nodes (the default) that is what the container itself reports: the in-container
checker's JSON line (tessera-gpu-check: device nodes, driver files, CUDA devices, nvidia-smi,
MPS) and the GPU environment, read from its log. On fake-runtime nodes it is the CDI device ids
the kubelet handed the runtime (the fake CRI's record), resolved through the node plugin's CDI
spec into the environment and device nodes a real runtime would inject.

usage: show-allocation.py --env-file DIR/env --namespace NS
Needs kubectl on PATH; reads KUBECONFIG and the node directories from the env file.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

DRIVER = "gpu.tessera.dev"
# Attributes shown per device, in this order (unqualified names are in the driver's domain).
COLUMNS = [
    ("device", None),
    ("product", "productName"),
    ("memory", "capacity:memory"),
    ("NUMA", "numaNode"),
    ("NVLink island", "nvlinkIsland"),
    ("PCIe root", "resource.kubernetes.io/pcieRoot"),
    ("driver", "driverVersion"),
    ("UUID", "uuid"),
]


def read_env(path):
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, value = line.split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] == "'":
                value = value[1:-1]
            env[key] = value
    return env


def kubectl(env, *args):
    result = subprocess.run(
        ["kubectl", *args, "-o", "json"],
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        sys.exit(f"show-allocation: kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def attribute(device, name):
    if name.startswith("capacity:"):
        value = device.get("capacity", {}).get(name.split(":", 1)[1], {}).get("value")
        return human_bytes(value) if value else "-"
    attrs = device.get("attributes", {})
    value = attrs.get(name) or attrs.get(f"{DRIVER}/{name}")
    if not value:
        return "-"
    return str(next(iter(value.values())))


def human_bytes(value):
    try:
        n = int(value)
    except ValueError:
        return value
    for unit in ["", "Ki", "Mi", "Gi", "Ti"]:
        if n < 1024 or unit == "Ti":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1024
    return value


def table(rows, indent):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows
    )


def published_devices(env):
    """(pool, device name) -> device, from the highest generation of each pool."""
    slices = kubectl(env, "get", "resourceslices", "--field-selector", f"spec.driver={DRIVER}")
    newest = {}
    for s in slices["items"]:
        pool = s["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), pool["generation"])
    devices = {}
    for s in slices["items"]:
        pool = s["spec"]["pool"]
        if pool["generation"] != newest[pool["name"]]:
            continue
        for d in s["spec"].get("devices", []):
            devices[(pool["name"], d["name"])] = d
    return devices


def node_dirs(env):
    """node name -> (record dir or None on containerd nodes, CDI spec dir)."""
    dirs = {}
    for i in range(1, int(env.get("TESSERA_NODE_COUNT", "0")) + 1):
        name = env.get(f"TESSERA_NODE_{i}_NAME")
        if name:
            dirs[name] = (env.get(f"TESSERA_NODE_{i}_CDI_RECORD_DIR"), env[f"TESSERA_NODE_{i}_CDI_SPEC_DIR"])
    return dirs


def container_log(env, namespace, pod, container):
    result = subprocess.run(
        ["kubectl", "-n", namespace, "logs", pod, "-c", container],
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        return None, result.stderr.strip()
    return result.stdout, None


def show_container_log(env, pod, container):
    """What a running container printed: the checker's report and its GPU environment."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    log, error = container_log(env, ns, name, container)
    if log is None:
        print(f"  container {container}: cannot read its log: {error}")
        return
    report = None
    env_lines = []
    for line in log.splitlines():
        line = line.strip()
        if line.startswith("{") and '"tesseraGpuCheck"' in line:
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                print(f"  container {container}: the checker printed an unreadable line: {line[:120]}")
        elif "=" in line:
            env_lines.append(line)
    if report is None:
        print(f"  container {container}: no checker report in its log (the image has no tessera-gpu-check)")
        for line in env_lines:
            print(f"      env {line}")
        return
    print(f"  container {container}: what it sees, by the in-container checker (kubectl -n {ns} logs {name} -c {container}):")
    nodes = [n["path"] for n in report.get("deviceNodes", [])]
    print(f"      device nodes   {' '.join(nodes) if nodes else '(none)'}")
    files = [f["path"] for f in report.get("driverFiles", [])]
    key = [f for f in files if os.path.basename(f) in ("libcuda.so.1", "libnvidia-ml.so.1", "nvidia-smi", "nvidia-cuda-mps-control")]
    if files:
        print(f"      driver files   {len(files)} mounted from the node's driver root, among them:")
        for f in key:
            print(f"                       {f}")
    else:
        print("      driver files   (none)")
    cuda = report.get("cuda", {})
    if cuda.get("loaded"):
        print(f"      CUDA           {cuda.get('path')}, cuInit {cuda.get('init')}, driver API {cuda.get('driverVersion')}")
        for d in cuda.get("devices", []):
            mps = ", MPS" if d.get("mpsEnabled") else ""
            print(f"                       device {d.get('index')}: {d.get('name')} {d.get('uuid')} ({human_bytes(str(d.get('memoryBytes', '')))}{mps})")
    else:
        print(f"      CUDA           not loaded: {cuda.get('error')}")
    smi = report.get("nvidiaSmi", {})
    if smi.get("exitCode") == 0:
        for line in smi.get("lines", []):
            print(f"      nvidia-smi -L  {line}")
    else:
        print(f"      nvidia-smi     {smi.get('error') or 'exit code ' + str(smi.get('exitCode'))}")
    mps = report.get("mps")
    if mps:
        print(f"      MPS            pipe {mps.get('pipeDirectory')} (daemon {'up' if mps.get('controlPresent') else 'absent'}), "
              f"active threads {mps.get('activeThreadPercentage')}%, pinned memory {mps.get('pinnedMemoryLimits')}")
    for key_name, value in sorted(report.get("env", {}).items()):
        print(f"      env            {key_name}={value}")


def cdi_edits(spec_dir):
    """fully qualified CDI device id -> (spec file, containerEdits)."""
    edits = {}
    for path in sorted(glob.glob(os.path.join(spec_dir, "*.json"))):
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        for device in spec.get("devices", []):
            edits[f"{spec['kind']}={device['name']}"] = (path, device.get("containerEdits", {}))
    return edits


def allocated_by(claim):
    if "gpu.tessera.dev/allocated-for" in claim["metadata"].get("annotations", {}):
        return "the Tessera controller"
    return "the default scheduler (kube-scheduler)"


def show_claim(claim, devices):
    allocation = claim.get("status", {}).get("allocation")
    name = claim["metadata"]["name"]
    if not allocation:
        print(f"  claim {name}: not allocated")
        return
    results = [r for r in allocation["devices"]["results"] if r["driver"] == DRIVER]
    print(f"  claim {name}: {len(results)} device(s), allocated by {allocated_by(claim)}")
    rows = [["request"] + [c[0] for c in COLUMNS]]
    for r in results:
        device = devices.get((r["pool"], r["device"]))
        row = [r["request"], f"{r['pool']}/{r['device']}"]
        row += [attribute(device, c[1]) if device else "(not published)" for c in COLUMNS[1:]]
        rows.append(row)
    print(table(rows, "    "))
    for config in allocation["devices"].get("config", []):
        opaque = config.get("opaque", {})
        if opaque.get("driver") == DRIVER:
            print(f"    config ({config.get('source')}): {json.dumps(opaque.get('parameters'))}")


def show_container(pod, container, record_dir, edits):
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    path = os.path.join(record_dir, f"{ns}_{name}_{container}.json")
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        print(f"  container {container}: no fake CRI record ({path})")
        return
    ids = record.get("cdiDevices", [])
    print(f"  container {container}: the kubelet handed the runtime {len(ids)} CDI device(s) ({path}):")
    env_lines, device_nodes, specs = [], [], set()
    for cdi_id in ids:
        print(f"    {cdi_id}")
        spec_path, edit = edits.get(cdi_id, (None, {}))
        if spec_path:
            specs.add(spec_path)
        env_lines += [e for e in edit.get("env", []) if e not in env_lines]
        device_nodes += [d["path"] for d in edit.get("deviceNodes", []) if d["path"] not in device_nodes]
    if specs:
        print(f"    which the node plugin's CDI spec ({', '.join(sorted(specs))}) turns into:")
        for line in env_lines:
            print(f"      env {line}")
        if device_nodes:
            print(f"      device nodes {' '.join(device_nodes)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args()
    env = read_env(args.env_file)
    devices = published_devices(env)
    dirs = node_dirs(env)
    pods = kubectl(env, "-n", args.namespace, "get", "pods")["items"]
    claims = {c["metadata"]["name"]: c for c in kubectl(env, "-n", args.namespace, "get", "resourceclaims")["items"]}
    if not pods:
        sys.exit(f"show-allocation: no pods in namespace {args.namespace}")
    for pod in pods:
        node = pod["spec"].get("nodeName", "<not scheduled>")
        gates = pod["spec"].get("schedulingGates") or []
        print(f"pod {args.namespace}/{pod['metadata']['name']}: {pod['status'].get('phase')} on node {node}"
              + (f", still gated by {[g['name'] for g in gates]}" if gates else ""))
        for status in pod["status"].get("resourceClaimStatuses", []):
            claim = claims.get(status.get("resourceClaimName", ""))
            if claim:
                show_claim(claim, devices)
        for entry in pod["spec"].get("resourceClaims", []):
            if entry.get("resourceClaimName") and entry["resourceClaimName"] in claims:
                show_claim(claims[entry["resourceClaimName"]], devices)
        record_dir, spec_dir = dirs.get(node, (None, None))
        if record_dir:
            edits = cdi_edits(spec_dir)
            for container in pod["spec"]["containers"]:
                show_container(pod, container["name"], record_dir, edits)
        elif spec_dir and pod["status"].get("phase") == "Running":
            for container in pod["spec"]["containers"]:
                show_container_log(env, pod, container["name"])
        print()


if __name__ == "__main__":
    main()
