# shellcheck shell=bash disable=SC2154 # root, state_dir, nodes, ... are local-up's variables
# Part of tests/e2e/local-up, sourced: installs Tessera with `helm upgrade --install` on the local
# containerd cluster. Expects root, state_dir, nodes, topologies, rust_log, install_env and the
# cluster's env file sourced (TESSERA_NODE_<i>_*).
#
# Every node is its own node group, selected by the harness's label tessera.dev/test-node, with its
# kubelet root, CDI directory and plugin state dir: the three kubelets share one host, so the
# chart's default host paths would collide. With a fake NVIDIA driver (local-up step 3), each
# group also gets its node's driver root and device root.

step "building the images (tests/e2e/images) and importing them into every node's containerd"
images_out=$("$root/tests/e2e/images" --import "$state_dir")
tessera_ref=$(awk '$1 == "tessera" { print $2 }' <<<"$images_out")
[[ -n "$tessera_ref" ]] || die "tests/e2e/images printed no tessera image: $images_out"
echo "$images_out" >&2

helm_bin=$("$root/tests/cluster/helm" --build-only)
namespace=tessera-system
values="$state_dir/tessera/values.yaml"
{
  echo "# Written by tests/e2e/local-up: the chart's values on the local cluster."
  echo "image:"
  echo "  repository: ${tessera_ref%:*}"
  echo "  tag: \"${tessera_ref##*:}\""
  echo "  pullPolicy: Never # imported into each node's containerd; there is no registry"
  echo "logFilter: \"$rust_log\""
  echo "kubeletPlugin:"
  echo "  backend: mock"
  echo "  # Short, so the e2e sees an idle claim (GPUs scripted 0% by a scenario) within seconds."
  echo "  gpuMetrics: {interval: 1s, idle: {threshold: 5, window: 3s}}"
  echo "  nodeGroups:"
  for i in $(seq 1 "$nodes"); do
    name_var="TESSERA_NODE_${i}_NAME" root_var="TESSERA_NODE_${i}_KUBELET_ROOT" cdi_var="TESSERA_NODE_${i}_CDI_SPEC_DIR"
    echo "    - name: node-$i"
    echo "      nodeSelector:"
    echo "        tessera.dev/test-node: ${!name_var}"
    echo "      topology: ${topologies[$((i - 1))]}"
    echo "      kubeletRootDir: ${!root_var}"
    echo "      cdiRoot: ${!cdi_var}"
    echo "      stateDir: $state_dir/nodes/${!name_var}/tessera"
    if $fake_driver; then
      echo "      driverRoot: ${driver_roots[i]}"
      echo "      devRoot: ${dev_roots[i]}"
    fi
  done
  echo "controller:"
  echo "  # The device-plugin conversion webhook: only namespaces labelled for it (scenario device-plugin-conversion)."
  echo "  devicePluginConversion: {enabled: true}"
} >"$values.tmp"
mv "$values.tmp" "$values"

# The chart is packaged once into the state dir and installed from there: the sharing scenarios'
# `helm upgrade` later in the run then uses the same chart even if the checkout changed meanwhile.
chart_dir="$state_dir/tessera/chart"
rm -rf "$chart_dir" && mkdir -p "$chart_dir"
"$helm_bin" package "$root/deploy/helm/tessera" --destination "$chart_dir" >&2
chart=$(find "$chart_dir" -maxdepth 1 -name 'tessera-*.tgz' -print -quit)
[[ -n "$chart" ]] || die "helm package wrote no tessera-*.tgz into $chart_dir"
# The chart's CI values (left out of the archive by .helmignore), beside it for the scenarios
# that render the chart with them (monitoring).
cp -r "$root/deploy/helm/tessera/ci" "$chart_dir/ci"

step "helm upgrade --install tessera $chart (namespace $namespace, image $tessera_ref)"
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >&2
"$helm_bin" upgrade --install tessera "$chart" \
  --kubeconfig "$KUBECONFIG" --namespace "$namespace" --values "$values" \
  --wait --timeout "${TESSERA_E2E_READY_TIMEOUT:-180}s" >&2 || {
  kubectl -n "$namespace" get pods -o wide >&2 || true
  kubectl -n "$namespace" describe pods >&2 || true
  die "helm install did not become ready; the pods are described above"
}

{
  echo "# Written by tests/e2e/local-up: how Tessera runs on this cluster (read by tests/e2e/run)."
  echo "TESSERA_E2E_INSTALL=helm"
  echo "TESSERA_E2E_NAMESPACE=$namespace"
  # What the sharing scenarios need to switch a node group's consumable shares and back.
  echo "TESSERA_E2E_HELM=$helm_bin"
  echo "TESSERA_E2E_CHART=$chart"
  echo "TESSERA_E2E_VALUES=$values"
  for i in $(seq 1 "$nodes"); do
    name_var="TESSERA_NODE_${i}_NAME"
    echo "TESSERA_E2E_PLUGIN_${i}_STATE_DIR=$state_dir/nodes/${!name_var}/tessera"
    if $fake_driver; then
      echo "TESSERA_E2E_NODE_${i}_DRIVER_ROOT=${driver_roots[i]}"
      echo "TESSERA_E2E_NODE_${i}_DEV_ROOT=${dev_roots[i]}"
    fi
  done
} >"$install_env.tmp"
mv "$install_env.tmp" "$install_env"

step "waiting for every node to publish its ResourceSlices"
deadline=$((SECONDS + ${TESSERA_E2E_READY_TIMEOUT:-180}))
while :; do
  published=$(kubectl get resourceslices --field-selector spec.driver=gpu.tessera.dev \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | grep -c . || true)
  ((published >= nodes)) && break
  if ((SECONDS >= deadline)); then
    kubectl -n "$namespace" logs -l app.kubernetes.io/component=kubelet-plugin --tail 30 >&2 || true
    die "only $published of $nodes nodes published ResourceSlices"
  fi
  sleep 1
done
kubectl -n "$namespace" get pods -o wide >&2
kubectl get resourceslices >&2 || true
