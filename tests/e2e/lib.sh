# shellcheck shell=bash
# Helpers of tests/e2e/local-up, local-down and scripts/demo; sourced, not run. Expects $root.

die() {
  printf '%s: %s\n' "$(basename "$0")" "$*" >&2
  exit 1
}
warn() { printf '%s: warning: %s\n' "$(basename "$0")" "$*" >&2; }
step() { printf '\n==> %s\n' "$*" >&2; }

# Cargo's target directory (CARGO_TARGET_DIR, else the workspace's target/).
target_dir() { echo "${CARGO_TARGET_DIR:-$root/target}"; }

# The workspace's binary targets, one per line (cached).
workspace_bins() {
  if [[ -z "${_tessera_bins:-}" ]]; then
    _tessera_bins=$( (cd "$root" && cargo metadata --no-deps --format-version 1 --locked 2>/dev/null) |
      python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "bin" in t["kind"]:
            print(t["name"])') || _tessera_bins=""
  fi
  printf '%s\n' "$_tessera_bins"
}

# has_workspace_bin NAME: whether the workspace has that binary target. (Not `workspace_bins |
# grep -q`: grep exits at the first match, the writer may get SIGPIPE, and pipefail turns that
# into "no".)
has_workspace_bin() {
  local bins
  bins=$(workspace_bins)
  grep -qx -- "$1" <<<"$bins"
}

# Whether the workspace has the tessera-controller binary (it lands after the node plugin).
has_controller_binary() { has_workspace_bin tessera-controller; }

# Whether the workspace has a fake NVIDIA driver (testing/fake-driver) and a node plugin that
# injects a driver root (it ships tessera-cdi-hook): then every local node gets a fake driver.
has_fake_driver() { has_workspace_bin tessera-fake-driver-root && has_workspace_bin tessera-cdi-hook; }

# The in-container GPU checker (crates/gpu-check): its cargo binary name when the workspace has
# it, else nothing.
checker_cargo_bin() { if has_workspace_bin tessera-gpu-check; then echo tessera-gpu-check; fi; }

# The built checker binary, or nothing when the workspace has none.
checker_binary() {
  local bin
  bin=$(checker_cargo_bin)
  [[ -n "$bin" && -x "$(target_dir)/debug/$bin" ]] && echo "$(target_dir)/debug/$bin"
  return 0
}

# live_pid PID_FILE MARKER: prints the pid if that process runs (not a zombie) and its command
# line contains MARKER (the state dir), so a recycled pid is never mistaken for ours.
live_pid() {
  local pid state
  [[ -f "$1" ]] || return 1
  pid=$(<"$1")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ "$state" != Z && "$state" != X ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2" || return 1
  echo "$pid"
}

# stop_pid PID NAME: SIGTERM, up to 15 s for a graceful shutdown, then SIGKILL.
stop_pid() {
  local pid="$1" name="$2" i state
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 150; i++)); do
    state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || break
    [[ "$state" != Z && "$state" != X ]] || break
    sleep 0.1
  done
  if ((i == 150)); then
    warn "$name (pid $pid) ignored SIGTERM for 15 s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  echo "$name: stopped (pid $pid)" >&2
}

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# process_keys FILE: the TESSERA_E2E_<PROCESS> prefixes of a processes.env, one per line.
process_keys() { sed -n 's/^\(TESSERA_E2E_[A-Z0-9_]*\)_RUN=.*/\1/p' "$1"; }

# env_value FILE KEY
env_value() { sed -n "s/^$2=//p" "$1" | head -n1; }

# wait_ready PROCESSES_ENV STATE_DIR TIMEOUT_SECONDS: waits until every process of the file
# answers 200 on /readyz; dies with its log tail if one exits or stays unready.
wait_ready() {
  local file="$1" marker="$2" timeout="$3" key name pid_file log metrics deadline body keys
  deadline=$((SECONDS + timeout))
  mapfile -t keys < <(process_keys "$file")
  for key in "${keys[@]}"; do
    name=$(env_value "$file" "${key}_NAME")
    pid_file=$(env_value "$file" "${key}_PIDFILE")
    log=$(env_value "$file" "${key}_LOG")
    metrics=$(env_value "$file" "${key}_METRICS")
    while :; do
      if body=$(curl -fsS --max-time 2 "http://$metrics/readyz" 2>&1); then
        echo "$name: ready" >&2
        break
      fi
      # The run script writes the pid file first; give it a moment to exist.
      if ! live_pid "$pid_file" "$marker" >/dev/null && [[ -f "$pid_file" ]]; then
        printf '%s exited; last lines of %s:\n' "$name" "$log" >&2
        tail -n 30 "$log" >&2 || true
        die "$name did not start"
      fi
      if ((SECONDS >= deadline)); then
        printf '%s is not ready after %s s (/readyz: %s); last lines of %s:\n' "$name" "$timeout" "$body" "$log" >&2
        tail -n 30 "$log" >&2 || true
        die "$name did not become ready"
      fi
      sleep 1
    done
  done
}
