# shellcheck shell=bash disable=SC2154 # root, state_dir, install_env are local-up's variables
# Part of tests/e2e/local-up --kueue, sourced after Tessera is installed: Kueue (tests/cluster/kueue:
# its manager built from the Go module, an image of it) imported into every node's containerd and
# installed with the Helm chart that ships inside Kueue's module.
#
# What the chart gets (DIR/kueue/values.yaml):
# - the local image, `pullPolicy: Never`; internal certificate management (Kueue signs its own
#   webhook certificate and injects the CA into its webhook configurations and CRDs); small
#   requests, so Kueue's pod hardly changes what the nodes have free for the scenarios' pods;
# - feature gates DynamicResourceAllocation and DRAExtendedResources (both alpha in v0.17.0): Kueue
#   counts the devices of a pod's ResourceClaimTemplates, and the extended resources a DeviceClass
#   stands for, against quotas, through `resources.deviceClassMappings`: `nvidia.com/gpu` is
#   Tessera's `gpu.tessera.dev`, `nvidia.com/gpu.shared` its shared class, and each MIG profile of
#   the A100 80GB node its class, so a Job written for the device plugin and a claim-template pod
#   charge the same quota;
# - integrations batch/job (held with spec.suspend) and pod (held with the scheduling gate
#   kueue.x-k8s.io/admission), only in namespaces labelled tessera.dev/kueue-managed=true: the
#   chart gives its webhooks the same namespace selector, so the other scenarios' pods never meet
#   them.
#
# Then it checks that the API server reaches Kueue through its Services (kube-proxy's rules on this
# host): a server-side dry run of a ClusterQueue passes Kueue's mutating and validating webhooks
# (failurePolicy Fail), and the visibility APIService turns Available (the aggregator's own check).

kueue_namespace=kueue-system
kueue_label=tessera.dev/kueue-managed
kueue_start=$SECONDS
step "Kueue: building its manager and image (tests/cluster/kueue)"
kueue_out=$("$root/tests/cluster/kueue")
kueue_value() { awk -v k="$1" '$1 == k { print $2 }' <<<"$kueue_out"; }
kueue_version=$(kueue_value version)
kueue_ref=$(kueue_value image)
kueue_chart=$(kueue_value chart)
[[ -n "$kueue_ref" && -n "$kueue_chart" ]] || die "tests/cluster/kueue printed no image or chart: $kueue_out"
cluster_bin=$("$root/tests/cluster/build" 2>/dev/null) || die "tests/cluster/build failed (run it to see why)"
"$cluster_bin/tessera-cluster" images import --state-dir "$state_dir" "$(kueue_value archive)" >&2
helm_bin="${helm_bin:-$("$root/tests/cluster/helm" --build-only)}"

mkdir -p "$state_dir/kueue"
kueue_values="$state_dir/kueue/values.yaml"
mig_profiles=(1g.10gb 1g.10gb.me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb)
{
  echo "# Written by tests/e2e/local-up --kueue: Kueue's chart values on the local cluster."
  echo "controllerManager:"
  echo "  manager:"
  echo "    image:"
  echo "      repository: ${kueue_ref%:*}"
  echo "      tag: \"${kueue_ref##*:}\""
  echo "      pullPolicy: Never # imported into each node's containerd; there is no registry"
  echo "    resources: {requests: {cpu: 50m, memory: 128Mi}, limits: {memory: 512Mi}}"
  echo "  featureGates:"
  echo "    - {name: DynamicResourceAllocation, enabled: true}"
  echo "    - {name: DRAExtendedResources, enabled: true}"
  echo "  readinessProbe: {initialDelaySeconds: 1}"
  echo "managerConfig:"
  echo "  controllerManagerConfigYaml: |-"
  echo "    apiVersion: config.kueue.x-k8s.io/v1beta2"
  echo "    kind: Configuration"
  echo "    health: {healthProbeBindAddress: \":8081\"}"
  echo "    metrics: {bindAddress: \":8443\"}"
  echo "    webhook: {port: 9443}"
  echo "    leaderElection: {leaderElect: true, resourceName: c1f6bfd2.kueue.x-k8s.io}"
  echo "    managedJobsNamespaceSelector:"
  echo "      matchLabels: {$kueue_label: \"true\"}"
  echo "    integrations:"
  echo "      frameworks: [batch/job, pod]"
  echo "    resources:"
  echo "      deviceClassMappings:"
  echo "        - {name: nvidia.com/gpu, deviceClassNames: [gpu.tessera.dev]}"
  echo "        - {name: nvidia.com/gpu.shared, deviceClassNames: [shared.gpu.tessera.dev]}"
  for profile in "${mig_profiles[@]}"; do
    echo "        - {name: nvidia.com/mig-$profile, deviceClassNames: [mig-$profile.gpu.tessera.dev]}"
  done
} >"$kueue_values.tmp"
mv "$kueue_values.tmp" "$kueue_values"

step "Kueue: helm upgrade --install kueue $kueue_chart (namespace $kueue_namespace, image $kueue_ref)"
kubectl create namespace "$kueue_namespace" --dry-run=client -o yaml | kubectl apply -f - >&2
"$helm_bin" upgrade --install kueue "$kueue_chart" \
  --kubeconfig "$KUBECONFIG" --namespace "$kueue_namespace" --values "$kueue_values" \
  --wait --timeout "${TESSERA_E2E_READY_TIMEOUT:-180}s" >&2 || {
  kubectl -n "$kueue_namespace" get pods -o wide >&2 || true
  kubectl -n "$kueue_namespace" describe pods >&2 || true
  kubectl -n "$kueue_namespace" logs deploy/kueue-controller-manager --tail 40 >&2 || true
  die "Kueue did not become ready; its pods are described above"
}

step "Kueue: the API server reaches its webhooks and its visibility API through their Services"
kueue_probe='{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "tessera-e2e-webhook-probe"}, "spec": {}}'
deadline=$((SECONDS + ${TESSERA_E2E_READY_TIMEOUT:-180}))
until kubectl create --dry-run=server -o name -f - <<<"$kueue_probe" >/dev/null 2>"$state_dir/kueue/probe.err"; do
  if ((SECONDS >= deadline)); then
    cat "$state_dir/kueue/probe.err" >&2
    die "the API server cannot reach Kueue's webhooks (Service kueue-webhook-service in $kueue_namespace)"
  fi
  sleep 1
done
kubectl wait --for=condition=Available --timeout="$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))s" \
  apiservice/v1beta2.visibility.kueue.x-k8s.io >&2 ||
  die "Kueue's visibility APIService is not Available: the API server cannot reach it (kubectl get apiservice v1beta2.visibility.kueue.x-k8s.io -o yaml)"
echo "Kueue $kueue_version built, imported, installed and reachable in $((SECONDS - kueue_start)) s" >&2

{
  echo "TESSERA_E2E_KUEUE=$kueue_version"
  echo "TESSERA_E2E_KUEUE_NAMESPACE=$kueue_namespace"
  echo "TESSERA_E2E_KUEUE_NAMESPACE_LABEL=$kueue_label"
} >>"$install_env"
