package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Container runtimes a node can use.
const (
	// RuntimeContainerd is containerd 2.x with runc, CNI bridge networking and
	// CDI: containers really run. The default.
	RuntimeContainerd = "containerd"
	// RuntimeFake is the recording fake CRI: nothing runs, each container
	// creation is written to a JSON record. Fast; for quick runs.
	RuntimeFake = "fake"
)

// ParseRuntime checks a --runtime value.
func ParseRuntime(s string) (string, error) {
	switch s {
	case RuntimeContainerd, RuntimeFake:
		return s, nil
	case "":
		return RuntimeContainerd, nil
	default:
		return "", fmt.Errorf("--runtime %q: pick %s (real containers) or %s (the recording fake CRI)", s, RuntimeContainerd, RuntimeFake)
	}
}

// The pod network of a containerd cluster. Every node of the host shares one
// bridge (they share the host's network namespace anyway); each node's
// host-local IPAM hands out addresses from its own /24 of the pod subnet. The
// bridge's address is the host's address on the pod network: the API server
// and the kubelets listen there, so pods reach them without leaving the host,
// and it is the nodes' InternalIP. The names are host-wide, so only one
// containerd cluster runs on a host at a time (`up` refuses a second).
const (
	BridgeName     = "tessera0"
	CNINetworkName = "tessera-pods"
	podSubnet      = "10.244.0.0/16"
	// KubeProxyTable is the nftables table kube-proxy (nftables mode) owns, in
	// the ip and ip6 families.
	KubeProxyTable = "kube-proxy"
)

// BridgeIP is the host's address on the pod bridge (the pods' gateway).
var BridgeIP = net.IPv4(10, 244, 0, 1)

// PodRange is the first and last pod address of the node with 1-based index i.
func PodRange(i int) (string, string) {
	return fmt.Sprintf("10.244.%d.2", i), fmt.Sprintf("10.244.%d.254", i)
}

// The sandbox ("pause") image every containerd pins. The cluster imports its own
// build of it under the upstream name, so manifests that name the upstream
// image (the smoke checks do) run without a registry.
const PauseImage = "registry.k8s.io/pause:3.10"

// ContainerdPaths are one node's containerd directories, all below a short
// per-node directory DIR/c<i>: containerd's shim sockets are
// <socket_dir>/<64 hex digits>, which must fit the 108-byte unix socket limit.
type ContainerdPaths struct {
	Dir string
}

func (c ContainerdPaths) Config() string     { return filepath.Join(c.Dir, "config.toml") }
func (c ContainerdPaths) Root() string       { return filepath.Join(c.Dir, "root") }
func (c ContainerdPaths) State() string      { return filepath.Join(c.Dir, "state") }
func (c ContainerdPaths) Socket() string     { return filepath.Join(c.Dir, "sock") }
func (c ContainerdPaths) TTRPC() string      { return filepath.Join(c.Dir, "ttrpc") }
func (c ContainerdPaths) ShimDir() string    { return filepath.Join(c.Dir, "s") }
func (c ContainerdPaths) RuncRoot() string   { return filepath.Join(c.Dir, "runc") }
func (c ContainerdPaths) Opt() string        { return filepath.Join(c.Dir, "opt") }
func (c ContainerdPaths) CNIConfDir() string { return filepath.Join(c.Dir, "cni") }
func (c ContainerdPaths) IPAMDir() string    { return filepath.Join(c.Dir, "ipam") }

// TaskDir holds one directory per running task (container or sandbox) of the
// k8s.io namespace, each with init.pid (the container's first process) and
// shim.pid; `down` uses them when containerd could not clean up itself.
func (c ContainerdPaths) TaskDir() string {
	return filepath.Join(c.State(), "io.containerd.runtime.v2.task", "k8s.io")
}

// CNIBinDirs are where Debian's containernetworking-plugins (and other
// installs) put bridge, host-local and loopback.
var CNIBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// containerdConfig renders one node's containerd configuration (version 3).
// Every path is the node's own, so several containerd instances share a host:
// root, state, the gRPC/ttrpc/debug sockets, the shims' socket dir, runc's
// state root, the opt dir, network namespaces (under state) and NRI (whose
// socket is host-wide) off. restrict_oom_score_adj: root here lacks
// CAP_SYS_RESOURCE, and runc fails every sandbox when asked to lower its OOM
// score. cdi_spec_dirs is the node's CDI directory only, where its node plugin
// writes. The sandbox image is pinned so the kubelet's image GC never removes
// it and nothing tries to pull it.
func containerdConfig(p ContainerdPaths, cdiDir string, binDirs []string) string {
	q := strconv.Quote
	list := func(items []string) string {
		quoted := make([]string, len(items))
		for i, s := range items {
			quoted[i] = q(s)
		}
		return "[" + strings.Join(quoted, ", ") + "]"
	}
	return fmt.Sprintf(`# Written by tests/cluster/up: one node's containerd.
version = 3
root = %s
state = %s

[grpc]
  address = %s

[ttrpc]
  address = %s

[debug]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = %s

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = %s

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %s

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [%s]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  Root = %s
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = %s
  conf_dir = %s
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`,
		q(p.Root()), q(p.State()), q(p.Socket()), q(p.TTRPC()), q(p.Opt()), q(p.ShimDir()),
		q(PauseImage), q(cdiDir), q(p.RuncRoot()), list(binDirs), q(p.CNIConfDir()))
}

// cniConfig renders the node's CNI network: the shared bridge, this node's
// /24 from host-local IPAM (its data under the node's directory), a default
// route through the bridge (containerd sets up the pods' loopback itself, as a
// network of its own). No IP masquerade and no port maps: pods talk to
// the host and to each other only, so no iptables rule is added.
func cniConfig(i int, ipamDir string) ([]byte, error) {
	start, end := PodRange(i)
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       CNINetworkName,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      BridgeName,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": false,
				"ipam": map[string]any{
					"type": "host-local",
					"ranges": []any{[]any{map[string]any{
						"subnet":     podSubnet,
						"rangeStart": start,
						"rangeEnd":   end,
						"gateway":    BridgeIP.String(),
					}}},
					"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
					"dataDir": ipamDir,
				},
			},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeProxyConfig is the KubeProxyConfiguration of the one kube-proxy a host
// needs (every node shares the host's network namespace): nftables mode (its
// rules live in one table, removed whole at `down`), conntrack sysctls left
// alone (maxPerCore 0 and zero timeouts mean "do not change"), node ports only
// on the bridge address.
func kubeProxyConfig(kubeconfig, hostname string, healthzPort, metricsPort int) map[string]any {
	return map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"mode":               "nftables",
		"clientConnection":   map[string]any{"kubeconfig": kubeconfig},
		"hostnameOverride":   hostname,
		"bindAddress":        BridgeIP.String(),
		"clusterCIDR":        podSubnet,
		"healthzBindAddress": fmt.Sprintf("127.0.0.1:%d", healthzPort),
		"metricsBindAddress": fmt.Sprintf("127.0.0.1:%d", metricsPort),
		"nodePortAddresses":  []string{BridgeIP.String() + "/32"},
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
	}
}

// writeContainerdFiles writes node i's containerd config and CNI network and
// creates its directories.
func writeContainerdFiles(i int, p ContainerdPaths, cdiDir string) error {
	for _, dir := range []string{p.Dir, p.CNIConfDir(), p.IPAMDir(), p.ShimDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	if err := os.WriteFile(p.Config(), []byte(containerdConfig(p, cdiDir, CNIBinDirs)), 0o644); err != nil {
		return fmt.Errorf("write containerd config %s: %w", p.Config(), err)
	}
	cni, err := cniConfig(i, p.IPAMDir())
	if err != nil {
		return fmt.Errorf("encode the CNI network of node %d: %w", i, err)
	}
	path := filepath.Join(p.CNIConfDir(), "10-"+CNINetworkName+".conflist")
	if err := os.WriteFile(path, cni, 0o644); err != nil {
		return fmt.Errorf("write CNI config %s: %w", path, err)
	}
	return nil
}
