# Shared helpers for the tests/cluster scripts. Source it; do not run it.

log() { echo "tests/cluster: $*" >&2; }
die() {
  echo "tests/cluster: error: $*" >&2
  exit 1
}

# cluster_cache_dir prints where built binaries are kept between runs.
cluster_cache_dir() {
  echo "${TESSERA_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera-cluster}"
}

# require_go fails with a clear message unless a Go toolchain that can build
# go.mod's `go 1.26.0` line is on PATH (GOTOOLCHAIN=auto fetches newer ones).
require_go() {
  command -v go >/dev/null 2>&1 \
    || die "go is not on PATH; install Go 1.26 or newer (https://go.dev/dl/) and retry"
  local v
  v="$(go env GOVERSION)"
  v="${v#go}"
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  if ((major < 1 || (major == 1 && minor < 22))); then
    die "go $v is too old to even fetch the toolchain go.mod asks for; install Go 1.26 or newer"
  fi
}
