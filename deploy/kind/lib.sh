# shellcheck shell=bash
# Shared settings of the deploy/kind scripts; sourced, not run. Every setting can be overridden
# from the environment.

# shellcheck disable=SC2034  # the variables are used by the scripts that source this file
TESSERA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KIND_DIR="$TESSERA_ROOT/deploy/kind"

# kind cluster name and the kubeconfig file the scripts write and read (kept apart from ~/.kube/config).
TESSERA_KIND_CLUSTER="${TESSERA_KIND_CLUSTER:-tessera}"
TESSERA_KIND_KUBECONFIG="${TESSERA_KIND_KUBECONFIG:-$HOME/.kube/kind-$TESSERA_KIND_CLUSTER.yaml}"
# Node image; the Kubernetes version Tessera is tested against (tests/cluster records it).
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.37.1}"
# The image deploy/kind/build-image builds and deploy/kind/install loads.
TESSERA_IMAGE="${TESSERA_IMAGE:-tessera:dev}"
# Namespace and release name of the chart.
TESSERA_NAMESPACE="${TESSERA_NAMESPACE:-tessera-system}"
TESSERA_RELEASE="${TESSERA_RELEASE:-tessera}"
# docker, or podman (kind then needs KIND_EXPERIMENTAL_PROVIDER=podman).
CONTAINER_TOOL="${CONTAINER_TOOL:-docker}"

die() {
  printf '%s: %s\n' "$(basename "$0")" "$*" >&2
  exit 1
}

step() { printf '\n==> %s\n' "$*"; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "needs \`$tool\` on PATH (see deploy/kind/README.md)"
  done
}

# helm: $HELM, helm on PATH, else the one tests/cluster builds from its pinned Go module.
helm_cmd() {
  if [[ -n "${HELM:-}" ]]; then
    "$HELM" "$@"
  elif command -v helm >/dev/null 2>&1; then
    helm "$@"
  else
    "$TESSERA_ROOT/tests/cluster/helm" "$@"
  fi
}

kind_kubectl() {
  kubectl --kubeconfig "$TESSERA_KIND_KUBECONFIG" "$@"
}
