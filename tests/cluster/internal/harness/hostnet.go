package harness

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What a containerd cluster changes on the host outside its state dir, and how
// `down` undoes it: the pod bridge (created by `up`, with the state dir as its
// alias so a leftover names its owner), the veths CNI attaches to it, kube-proxy's
// nftables tables, libcni's cached results, the containers' cgroups, and the
// shims and container processes (which containerd starts in sessions of their
// own, so stopping containerd does not stop them).

// cniResultsDir is where libcni (inside containerd) caches each attachment's result.
const cniResultsDir = "/var/lib/cni/results"

// cgroupRoot is the cgroup v1 hierarchy the machines mount (tmpfs with one
// directory per controller).
const cgroupRoot = "/sys/fs/cgroup"

func run(name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// bridgeOwner returns the state dir recorded on the pod bridge, "" with ok
// when the bridge exists without one, and !ok when there is no bridge.
func bridgeOwner() (owner string, ok bool) {
	if _, err := net.InterfaceByName(BridgeName); err != nil {
		return "", false
	}
	data, err := os.ReadFile("/sys/class/net/" + BridgeName + "/ifalias")
	if err != nil {
		return "", true
	}
	return strings.TrimSpace(string(data)), true
}

// nftTables lists the nftables tables named KubeProxyTable, as "family name".
func nftTables() ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil // no nft, so kube-proxy could not have made any
	}
	out, err := run("nft", "list", "tables")
	if err != nil {
		return nil, err
	}
	var tables []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[0] == "table" && fields[2] == KubeProxyTable {
			tables = append(tables, fields[1]+" "+fields[2])
		}
	}
	return tables, nil
}

// setUpHostNetwork creates the pod bridge with the host's pod-network address,
// refusing when another cluster's bridge or kube-proxy rules are present.
func setUpHostNetwork(stateDir string) error {
	if owner, exists := bridgeOwner(); exists {
		if owner == "" {
			owner = "unknown"
		}
		return fmt.Errorf("network bridge %s already exists (cluster state dir: %s): one containerd cluster runs on a host at a time; stop it with tests/cluster/down --state-dir %s, or use --runtime fake",
			BridgeName, owner, owner)
	}
	tables, err := nftTables()
	if err != nil {
		return err
	}
	if len(tables) > 0 {
		return fmt.Errorf("nftables table(s) %v exist: another kube-proxy runs on this host, or a cluster was not torn down (tests/cluster/down removes them)", tables)
	}
	// Kubernetes chains already on the host (a kubelet of another cluster kind,
	// e.g. one with the fake runtime and iptables util chains, made them) are
	// not this cluster's: down only reports chains that were not there before.
	var before []string
	if out, err := run("nft", "list", "ruleset"); err == nil {
		before = kubeChains(out)
	}
	if err := os.WriteFile(filepath.Join(stateDir, hostChainsBaseline), []byte(strings.Join(before, "\n")), 0o644); err != nil {
		return fmt.Errorf("record the host's Kubernetes chains: %w", err)
	}
	steps := [][]string{
		{"link", "add", BridgeName, "type", "bridge"},
		{"link", "set", BridgeName, "alias", stateDir},
		{"addr", "add", BridgeIP.String() + "/16", "dev", BridgeName},
		{"link", "set", BridgeName, "up"},
	}
	for _, args := range steps {
		if _, err := run("ip", args...); err != nil {
			return fmt.Errorf("create the pod bridge: %w", err)
		}
	}
	return nil
}

// killContainerProcesses SIGKILLs what containerd left running for a node:
// every task's first process (the container's PID namespace dies with it) and
// then the shims, by the PIDs containerd recorded, plus any shim whose command
// line names this cluster's state dir.
func killContainerProcesses(layout Layout, nodes int, logger *log.Logger) {
	for i := 1; i <= nodes; i++ {
		tasks, _ := os.ReadDir(layout.Containerd(i).TaskDir())
		for _, t := range tasks {
			dir := filepath.Join(layout.Containerd(i).TaskDir(), t.Name())
			for _, file := range []string{"init.pid", "shim.pid"} {
				if pid, err := readPID(filepath.Join(dir, file)); err == nil && processAlive(pid) {
					logger.Printf("killing %s %d of task %.12s", strings.TrimSuffix(file, ".pid"), pid, t.Name())
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	}
	for _, pid := range shimPIDs(layout.StateDir) {
		logger.Printf("killing containerd shim %d", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(shimPIDs(layout.StateDir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
}

// shimPIDs are the live containerd shims whose command line names stateDir
// (they are started with `-address <node's containerd socket>`).
func shimPIDs(stateDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !processAlive(pid) {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || !strings.HasPrefix(string(comm), "containerd-shim") {
			continue
		}
		if cmdlineMentions(pid, stateDir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// containerCgroups are the cgroup directories runc made for the containers of
// a node (named by container ID below each controller's k8s.io directory).
func containerCgroups() []string {
	var dirs []string
	controllers, _ := os.ReadDir(cgroupRoot)
	for _, c := range controllers {
		matches, _ := filepath.Glob(filepath.Join(cgroupRoot, c.Name(), "k8s.io", "*"))
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() {
				dirs = append(dirs, m)
			}
		}
	}
	return dirs
}

// tearDownHostNetwork removes the bridge (if this cluster owns it), the veths
// still attached to it, kube-proxy's tables and libcni's cached results of the
// pod network.
func tearDownHostNetwork(stateDir string, logger *log.Logger) error {
	var failed []string
	owner, exists := bridgeOwner()
	if exists && owner == stateDir {
		for _, veth := range bridgePorts() {
			if _, err := run("ip", "link", "delete", veth); err != nil {
				failed = append(failed, err.Error())
			}
		}
		if _, err := run("ip", "link", "delete", BridgeName); err != nil {
			failed = append(failed, err.Error())
		} else {
			logger.Printf("deleted bridge %s", BridgeName)
		}
	}
	tables, err := nftTables()
	if err != nil {
		failed = append(failed, err.Error())
	}
	for _, t := range tables {
		if _, err := run("nft", append([]string{"delete", "table"}, strings.Fields(t)...)...); err != nil {
			failed = append(failed, err.Error())
		} else {
			logger.Printf("deleted nftables table %s", t)
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniResultsDir, CNINetworkName+"-*"))
	for _, r := range results {
		if err := os.Remove(r); err != nil && !errors.Is(err, os.ErrNotExist) {
			failed = append(failed, err.Error())
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("tear down the pod network: %s", strings.Join(failed, "; "))
	}
	return nil
}

// bridgePorts are the interfaces attached to the pod bridge.
func bridgePorts() []string {
	entries, _ := os.ReadDir("/sys/class/net/" + BridgeName + "/brif")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// removeContainerCgroups removes the (empty, once their processes are gone)
// cgroups of containers runc did not delete.
func removeContainerCgroups(logger *log.Logger) {
	dirs := containerCgroups()
	// Deepest first: a directory can only be removed once its children are.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err == nil {
			logger.Printf("removed cgroup %s", dirs[i])
		}
	}
	// The k8s.io parents runc made, once empty (a busy one stays).
	parents, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "k8s.io"))
	for _, p := range parents {
		_ = syscall.Rmdir(p)
	}
}

// Leftovers lists what a stopped cluster still has on the host: processes of
// the cluster (components by pid file, containerd shims), mounts under the
// state dir, and for a containerd cluster its bridge, veths, kube-proxy
// tables, cached CNI results and container cgroups. Empty means clean.
func Leftovers(layout Layout, containerd bool) []string {
	var found []string
	entries, _ := os.ReadDir(layout.PIDDir())
	for _, e := range entries {
		if pid, err := readPID(filepath.Join(layout.PIDDir(), e.Name())); err == nil && processAlive(pid) && cmdlineMentions(pid, layout.StateDir) {
			found = append(found, fmt.Sprintf("process %d (%s)", pid, strings.TrimSuffix(e.Name(), ".pid")))
		}
	}
	for _, pid := range shimPIDs(layout.StateDir) {
		found = append(found, fmt.Sprintf("containerd shim %d", pid))
	}
	for _, m := range mountsUnder(layout.StateDir) {
		found = append(found, "mount "+m)
	}
	if !containerd {
		return found
	}
	if owner, exists := bridgeOwner(); exists && owner == layout.StateDir {
		found = append(found, "bridge "+BridgeName)
		for _, p := range bridgePorts() {
			found = append(found, "veth "+p+" on "+BridgeName)
		}
	}
	if tables, err := nftTables(); err != nil {
		found = append(found, "cannot list nftables tables: "+err.Error())
	} else {
		for _, t := range tables {
			found = append(found, "nftables table "+t)
		}
	}
	if out, err := run("nft", "list", "ruleset"); err == nil {
		for _, chain := range newChains(kubeChains(out), layout.StateDir) {
			found = append(found, "nftables/iptables chain "+chain)
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniResultsDir, CNINetworkName+"-*"))
	for _, r := range results {
		found = append(found, "CNI result "+r)
	}
	for _, c := range containerCgroups() {
		found = append(found, "cgroup "+c)
	}
	return found
}

// hostChainsBaseline is the state dir's record of the Kubernetes chains the
// host had before the cluster's network was set up.
const hostChainsBaseline = "host-chains-before"

// newChains drops the chains recorded in stateDir's baseline. Without a
// baseline (a cluster from before it was recorded) only kube-proxy's own
// tables can be told apart as ours, and those are checked by table.
func newChains(chains []string, stateDir string) []string {
	data, err := os.ReadFile(filepath.Join(stateDir, hostChainsBaseline))
	if err != nil {
		var ours []string
		for _, c := range chains {
			if fields := strings.Fields(c); len(fields) == 3 && fields[1] == KubeProxyTable {
				ours = append(ours, c)
			}
		}
		return ours
	}
	old := map[string]bool{}
	for _, c := range strings.Split(string(data), "\n") {
		old[c] = true
	}
	var fresh []string
	for _, c := range chains {
		if !old[c] {
			fresh = append(fresh, c)
		}
	}
	return fresh
}

// kubeChains lists the Kubernetes chains ("KUBE-…", as kube-proxy and the
// kubelet name theirs) of an `nft list ruleset` output, as "family table chain".
func kubeChains(ruleset string) []string {
	var table string
	var chains []string
	for _, line := range strings.Split(ruleset, "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 3 && fields[0] == "table":
			table = fields[1] + " " + fields[2]
		case len(fields) >= 2 && fields[0] == "chain" && strings.HasPrefix(fields[1], "KUBE-"):
			chains = append(chains, table+" "+fields[1])
		}
	}
	return chains
}
