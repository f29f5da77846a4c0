package harness

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// markerFile marks a directory as a cluster state dir, so `up` and `down`
// never wipe a directory they did not create.
const markerFile = ".tessera-cluster"

// UpOptions configure `up`.
type UpOptions struct {
	StateDir string
	BinDir   string
	Nodes    int
	Timeout  time.Duration
	// ExtraFeatureGates ("A=true,B=false") are overlaid on FeatureGates.
	ExtraFeatureGates string
	// RuntimeConfig is appended to the API server's --runtime-config (after
	// the package's RuntimeConfig).
	RuntimeConfig string
	// Runtime is RuntimeContainerd (default) or RuntimeFake.
	Runtime string
	// Images are OCI archives every node's containerd imports before its
	// kubelet starts, besides the pause image of the bin dir; ignored with the
	// fake runtime.
	Images []string
	Logger *log.Logger
}

// Up boots the cluster and returns the admin kubeconfig path once every node
// is Ready. A cluster already running in the state dir with the same number
// of nodes is reused.
func Up(ctx context.Context, opts UpOptions) (string, error) {
	if opts.Nodes < 1 || opts.Nodes > MaxNodes {
		return "", fmt.Errorf("--nodes %d: the local cluster runs 1 to %d kubelet nodes", opts.Nodes, MaxNodes)
	}
	if os.Geteuid() != 0 {
		return "", errors.New("the kubelet must run as root (it mounts volumes and sets sysctls); run tests/cluster/up as root")
	}
	stateDir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return "", fmt.Errorf("resolve state dir %q: %w", opts.StateDir, err)
	}
	layout := Layout{StateDir: stateDir}
	if root := layout.Node(1).KubeletRoot; len(root) > maxKubeletRootLen {
		return "", fmt.Errorf("state dir %s is too long: kubelet root %s is %d bytes, at most %d keep plugin socket paths under the 108-byte unix socket limit; pick a shorter --state-dir",
			stateDir, root, len(root), maxKubeletRootLen)
	}
	gates, err := ParseFeatureGates(FeatureGates, opts.ExtraFeatureGates)
	if err != nil {
		return "", fmt.Errorf("TESSERA_EXTRA_FEATURE_GATES: %w", err)
	}

	if opts.Runtime, err = ParseRuntime(opts.Runtime); err != nil {
		return "", err
	}
	if pid, alive := supervisorPID(layout); alive {
		plan, err := ReadPlan(layout.PlanFile())
		if err != nil {
			return "", err
		}
		if plan.Runtime != opts.Runtime {
			return "", fmt.Errorf("a cluster with the %s runtime is already running in %s (supervisor pid %d); run tests/cluster/down --state-dir %s first",
				plan.Runtime, stateDir, pid, stateDir)
		}
		if plan.Nodes != opts.Nodes {
			return "", fmt.Errorf("a cluster with %d node(s) is already running in %s (supervisor pid %d); run tests/cluster/down --state-dir %s first",
				plan.Nodes, stateDir, pid, stateDir)
		}
		opts.Logger.Printf("reusing the cluster already running in %s", stateDir)
		return layout.AdminKubeconfig(), waitClusterReady(ctx, layout, plan, opts.Timeout, opts.Logger)
	}
	if err := resetStateDir(layout, opts.Logger); err != nil {
		return "", err
	}
	plan, err := prepare(layout, opts, gates)
	if err != nil {
		return "", err
	}
	if plan.Runtime == RuntimeContainerd {
		if err := setUpHostNetwork(layout.StateDir); err != nil {
			return "", err
		}
	}
	if err := startSupervisor(layout); err != nil {
		return "", err
	}
	if err := waitClusterReady(ctx, layout, plan, opts.Timeout, opts.Logger); err != nil {
		return "", err
	}
	return layout.AdminKubeconfig(), nil
}

// resetStateDir cleans up whatever a previous cluster left and empties the dir.
func resetStateDir(layout Layout, logger *log.Logger) error {
	entries, err := os.ReadDir(layout.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return os.MkdirAll(layout.StateDir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("read state dir %s: %w", layout.StateDir, err)
	}
	if len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(layout.StateDir, markerFile)); err != nil {
			return fmt.Errorf("state dir %s is not empty and was not created by tests/cluster/up; refusing to wipe it (pick another --state-dir)", layout.StateDir)
		}
		if err := Down(DownOptions{StateDir: layout.StateDir, Purge: true, Logger: logger}); err != nil {
			return fmt.Errorf("clean up the previous cluster in %s: %w", layout.StateDir, err)
		}
	}
	return os.MkdirAll(layout.StateDir, 0o755)
}

// prepare writes certificates, kubeconfigs, kubelet configs, the plan and the
// env file.
func prepare(layout Layout, opts UpOptions, gates map[string]bool) (*Plan, error) {
	if err := os.WriteFile(filepath.Join(layout.StateDir, markerFile), nil, 0o644); err != nil {
		return nil, fmt.Errorf("mark state dir: %w", err)
	}
	for _, dir := range []string{layout.LogDir(), layout.PIDDir(), layout.ConfigDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	binDir, err := filepath.Abs(opts.BinDir)
	if err != nil {
		return nil, fmt.Errorf("resolve bin dir %q: %w", opts.BinDir, err)
	}
	ports, err := NewPorts(opts.Nodes, opts.Runtime)
	if err != nil {
		return nil, err
	}
	var images []string
	if opts.Runtime == RuntimeContainerd {
		// The pod sandbox image tests/cluster/build packs next to the binaries.
		for _, image := range append([]string{filepath.Join(binDir, "pause.tar")}, opts.Images...) {
			abs, err := filepath.Abs(image)
			if err != nil {
				return nil, fmt.Errorf("resolve image archive %q: %w", image, err)
			}
			if _, err := os.Stat(abs); err != nil {
				return nil, fmt.Errorf("image archive %s: %w", abs, err)
			}
			images = append(images, abs)
		}
	}
	plan := &Plan{
		KubeVersion:   KubeVersion,
		StateDir:      layout.StateDir,
		BinDir:        binDir,
		Nodes:         opts.Nodes,
		Ports:         ports,
		FeatureGates:  gates,
		RuntimeConfig: opts.RuntimeConfig,
		Runtime:       opts.Runtime,
		Images:        images,
	}
	pki, err := NewPKI(layout.PKIDir(), ServiceIP, BridgeIP)
	if err != nil {
		return nil, err
	}
	identities := []Identity{AdminIdentity, ControllerManagerIdentity, SchedulerIdentity, APIServerKubeletClient, KubeProxyIdentity}
	for i := 1; i <= opts.Nodes; i++ {
		identities = append(identities, NodeIdentity(NodeName(i)))
	}
	// The front proxy's certificate has no kubeconfig: only the API server uses it.
	for _, id := range append(identities, FrontProxyClient) {
		if err := pki.IssueClient(id); err != nil {
			return nil, err
		}
	}
	if err := writeKubeconfig(layout.AdminKubeconfig(), plan.APIServerURL(), pki, AdminIdentity); err != nil {
		return nil, err
	}
	for _, id := range identities[1:] {
		if err := writeKubeconfig(layout.Kubeconfig(id.File), plan.APIServerURL(), pki, id); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		node := layout.Node(i)
		for _, dir := range []string{node.Dir, node.KubeletRoot, node.CDIRecordDir(), node.CDISpecDir(), node.PodLogsDir(), node.KubeletWorkDir()} {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("create %s: %w", dir, err)
			}
		}
		criSocket, address := node.CRISocket(), "127.0.0.1"
		if plan.Runtime == RuntimeContainerd {
			paths := layout.Containerd(i)
			if err := writeContainerdFiles(i, paths, node.CDISpecDir()); err != nil {
				return nil, err
			}
			criSocket, address = paths.Socket(), BridgeIP.String()
		}
		cfg := kubeletConfig(node, ports.Kubelets[i-1], criSocket, address, pki.CACert(), gates)
		if err := writeKubeletConfig(node.KubeletConfig(), cfg); err != nil {
			return nil, err
		}
	}
	if plan.Runtime == RuntimeContainerd {
		cfg := kubeProxyConfig(layout.Kubeconfig(KubeProxyIdentity.File), NodeName(1), ports.KubeProxyHealthz, ports.KubeProxyMetrics)
		if err := writeKubeletConfig(layout.KubeProxyConfig(), cfg); err != nil {
			return nil, err
		}
	}
	buildComponents(plan, layout, pki)
	for _, c := range plan.Components {
		if _, err := os.Stat(c.Args[0]); err != nil {
			return nil, fmt.Errorf("component binary %s is missing (run tests/cluster/build): %w", c.Args[0], err)
		}
	}
	if err := WritePlan(layout.PlanFile(), plan); err != nil {
		return nil, err
	}
	if err := writeEnvFile(layout.EnvFile(), EnvFileVars(plan, layout)); err != nil {
		return nil, err
	}
	return plan, nil
}

// startSupervisor launches `tessera-cluster supervise` in its own session so
// it outlives `up`.
func startSupervisor(layout Layout) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	logPath := layout.LogFile("supervisor")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", logPath, err)
	}
	defer logFile.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devNull.Close()
	cmd := exec.Command(self, "supervise", "--state-dir", layout.StateDir)
	cmd.Dir = layout.StateDir
	cmd.Stdin = devNull
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the supervisor: %w", err)
	}
	return cmd.Process.Release()
}
