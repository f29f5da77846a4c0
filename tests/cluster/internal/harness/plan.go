package harness

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// Probe tells the supervisor how to see that a component is up.
type Probe struct {
	// Kind is "http" (plain GET, 200 wanted), "https-insecure" (GET over TLS
	// without verifying the serving certificate), "https-client" (GET with the
	// admin client certificate, verifying against the cluster CA), "node-ready"
	// (GET the Node object at URL like https-client; its Ready condition must be
	// True) or "unix" (the socket at Path accepts connections).
	Kind string `json:"kind"`
	URL  string `json:"url,omitempty"`
	Path string `json:"path,omitempty"`
}

// Component is one process the supervisor runs.
type Component struct {
	Name string `json:"name"`
	// Stage orders start-up: every component of a stage is started, then all
	// their probes must pass before the next stage starts. Shutdown runs in
	// reverse stage order.
	Stage int `json:"stage"`
	// Args is the full argv; Args[0] is the component's symlink in the bin dir,
	// whose base name selects the component in the multi-call binary.
	Args []string `json:"args"`
	// OneShot components run to completion during start-up (exit status 0 is
	// their probe) and are not stopped.
	OneShot bool `json:"oneShot,omitempty"`
	// StopHook runs to completion before the component is signalled to stop
	// (containerd: remove every pod sandbox while containerd still answers).
	StopHook       []string `json:"stopHook,omitempty"`
	LogFile        string   `json:"logFile"`
	Probe          Probe    `json:"probe"`
	StartTimeoutS  int      `json:"startTimeoutSeconds"`
	StopTimeoutS   int      `json:"stopTimeoutSeconds"`
	ExtraEnv       []string `json:"extraEnv,omitempty"`
	PIDFile        string   `json:"pidFile"`
	WorkingDirPath string   `json:"workingDir"`
}

// Ports are the loopback TCP ports the cluster listens on, chosen free at `up`.
type Ports struct {
	EtcdClient        int         `json:"etcdClient"`
	EtcdPeer          int         `json:"etcdPeer"`
	APIServer         int         `json:"apiServer"`
	ControllerManager int         `json:"controllerManager"`
	Scheduler         int         `json:"scheduler"`
	Kubelets          []NodePorts `json:"kubelets"`
	// KubeProxyHealthz and KubeProxyMetrics are 0 with the fake runtime (no kube-proxy).
	KubeProxyHealthz int `json:"kubeProxyHealthz,omitempty"`
	KubeProxyMetrics int `json:"kubeProxyMetrics,omitempty"`
}

// NodePorts are one kubelet's ports.
type NodePorts struct {
	Server  int `json:"server"`
	Healthz int `json:"healthz"`
}

// Plan is everything `up` decided, written to plan.json for the supervisor
// and for `down`.
type Plan struct {
	KubeVersion string `json:"kubeVersion"`
	StateDir    string `json:"stateDir"`
	BinDir      string `json:"binDir"`
	Nodes       int    `json:"nodes"`
	// Runtime is RuntimeContainerd or RuntimeFake.
	Runtime string `json:"runtime"`
	// Images are OCI archives imported into every node's containerd before
	// the kubelets start (the pause image).
	Images        []string        `json:"images,omitempty"`
	Ports         Ports           `json:"ports"`
	FeatureGates  map[string]bool `json:"featureGates"`
	RuntimeConfig string          `json:"runtimeConfig"`
	Components    []Component     `json:"components"`
}

// APIServerURL is where clients reach the API server.
func (p *Plan) APIServerURL() string {
	return "https://" + p.APIServerHost() + ":" + strconv.Itoa(p.Ports.APIServer)
}

// APIServerHost is the address the API server listens on: loopback with the
// fake runtime; with containerd the pod bridge's host address, which pods
// reach (through the `kubernetes` service) and which the nodes report.
func (p *Plan) APIServerHost() string {
	if p.Runtime == RuntimeContainerd {
		return BridgeIP.String()
	}
	return "127.0.0.1"
}

// ServiceIP is the first address of the service range, the `kubernetes`
// service's cluster IP; the serving certificate must name it.
var ServiceIP = net.IPv4(10, 0, 0, 1)

const serviceCIDR = "10.0.0.0/24"

// allocatePorts reserves n distinct free loopback ports. The listeners are
// closed before returning, so another process could in principle grab a port
// before the component binds it; on a test machine that is rare and `up`
// then fails with the component's bind error in its log.
func allocatePorts(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free loopback port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// NewPorts picks the ports for a cluster with the given number of nodes.
func NewPorts(nodes int, runtime string) (Ports, error) {
	free, err := allocatePorts(7 + 2*nodes)
	if err != nil {
		return Ports{}, err
	}
	p := Ports{EtcdClient: free[0], EtcdPeer: free[1], APIServer: free[2], ControllerManager: free[3], Scheduler: free[4]}
	for i := range nodes {
		p.Kubelets = append(p.Kubelets, NodePorts{Server: free[5+2*i], Healthz: free[6+2*i]})
	}
	if runtime == RuntimeContainerd {
		p.KubeProxyHealthz, p.KubeProxyMetrics = free[5+2*nodes], free[6+2*nodes]
	}
	return p, nil
}

// WritePlan stores the plan as JSON.
func WritePlan(path string, plan *Plan) error {
	data, err := json.MarshalIndent(plan, "", "  ")
	if err != nil {
		return fmt.Errorf("encode plan: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write plan %s: %w", path, err)
	}
	return nil
}

// ReadPlan loads the plan `up` wrote.
func ReadPlan(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read plan %s (was the cluster started with tests/cluster/up?): %w", path, err)
	}
	var plan Plan
	if err := json.Unmarshal(data, &plan); err != nil {
		return nil, fmt.Errorf("decode plan %s: %w", path, err)
	}
	return &plan, nil
}

// bin is the path of a component's symlink in the bin dir.
func (p *Plan) bin(component string) string { return filepath.Join(p.BinDir, component) }
