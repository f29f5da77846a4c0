# shellcheck shell=bash
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

# require_go fails with a clear message unless a Go toolchain is on PATH that
# can build go.mod's `go 1.26.0` line (GOTOOLCHAIN=auto fetches a newer
# toolchain through the module proxy when the local one is older).
require_go() {
  command -v go >/dev/null 2>&1 \
    || die "go is not on PATH; install Go 1.26 or newer (https://go.dev/dl/) and retry"
  local v major rest minor
  v="$(go env GOVERSION)"
  v="${v#go}"
  major="${v%%.*}"
  rest="${v#*.}"
  minor="${rest%%.*}"
  if ((major < 1 || (major == 1 && minor < 21))); then
    die "go $v is too old to fetch the toolchain go.mod asks for; install Go 1.26 or newer"
  fi
  command -v flock >/dev/null 2>&1 || die "flock (util-linux) is not on PATH"
  command -v sha256sum >/dev/null 2>&1 || die "sha256sum (coreutils) is not on PATH"
}

# lock_build_cache serialises builds that share the cache (helpers and CI jobs
# may run at once). Go's own caches are safe for concurrent use; our
# rename-into-place is not. The lock is released when the calling script exits.
lock_build_cache() {
  local cache_root="$1"
  mkdir -p "$cache_root/bin"
  exec 9>"$cache_root/build.lock"
  flock 9
  # Half-built outputs of an interrupted build are garbage once we hold the lock.
  rm -rf "$cache_root"/bin/.build-*
}

# go_build_cached NAME MODULE_DIR PACKAGE LDFLAGS SOURCE_PATHS...
# Builds PACKAGE (relative to MODULE_DIR, or an import path) into
# $cache/bin/NAME-<hash>/NAME unless that exists already, and prints the
# directory. The hash covers the Go version, LDFLAGS, the build tags in
# $GO_BUILD_TAGS, the module's go.mod and go.sum, and the non-test Go files
# under SOURCE_PATHS (relative to MODULE_DIR). Call lock_build_cache first.
go_build_cached() {
  local name="$1" module_dir="$2" pkg="$3" ldflags="$4"
  shift 4
  local cache_root key out start tmp
  cache_root="$(cluster_cache_dir)"
  key="$(
    {
      go version
      echo "$ldflags"
      echo "tags: ${GO_BUILD_TAGS:-}"
      cat "$module_dir/go.mod" "$module_dir/go.sum"
      if (($#)); then
        find "${@/#/$module_dir/}" -name '*.go' -not -name '*_test.go' -type f | LC_ALL=C sort | xargs cat
      fi
    } | sha256sum | cut -c1-16
  )"
  out="$cache_root/bin/$name-$key"
  if [[ -x "$out/$name" ]]; then
    log "$name: cached at $out/$name"
  else
    log "$name: building $pkg (this takes a while on a cold cache)"
    start=$SECONDS
    tmp="$(mktemp -d "$cache_root/bin/.build-$name-XXXXXX")"
    # No -trimpath: `go test`/`go vet` of the harness then reuse the compiled
    # packages of this build. -s -w drop the symbol table and DWARF, which
    # shortens the link and halves the binary. No cgo: nothing here needs it.
    (cd "$module_dir" && CGO_ENABLED=0 go build -tags "${GO_BUILD_TAGS:-}" -ldflags "$ldflags" -o "$tmp/$name" "$pkg") \
      || { rm -rf "$tmp"; die "building $name failed (see the go output above)"; }
    rm -rf "$out"
    mv "$tmp" "$out"
    log "$name: built in $((SECONDS - start))s at $out/$name"
  fi
  echo "$out"
}

# ensure_runtime_packages installs, when missing, what the containerd runtime
# needs from the distribution: runc, the CNI bridge/host-local/loopback
# plugins, nft (kube-proxy's nftables mode) and iproute2 (the pod bridge).
# Debian/Ubuntu only (apt-get); elsewhere it names what to install.
ensure_runtime_packages() {
  local missing=()
  command -v runc >/dev/null 2>&1 || [[ -x /usr/sbin/runc ]] || missing+=(runc)
  [[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || missing+=(containernetworking-plugins)
  command -v nft >/dev/null 2>&1 || [[ -x /usr/sbin/nft ]] || missing+=(nftables)
  command -v ip >/dev/null 2>&1 || [[ -x /usr/sbin/ip ]] || missing+=(iproute2)
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null 2>&1 \
    || die "the containerd runtime needs ${missing[*]} (Debian package names); install them, or use --runtime fake"
  [[ "$(id -u)" == 0 ]] || die "installing ${missing[*]} needs root"
  log "installing ${missing[*]} (apt)"
  # A fresh machine may have no package lists yet.
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
}
