// Package harness boots and tears down the local test cluster: real etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kubelets (built
// from Go modules into the k8s multi-call binary) on loopback, each kubelet
// talking to its own recording fake CRI runtime.
package harness

import (
	"fmt"
	"path/filepath"
)

// KubeVersion is the Kubernetes release the components are built from; the
// build script passes the same value to the linker.
const KubeVersion = "v1.37.1"

// maxKubeletRootLen bounds the kubelet root dir so that the longest plugin
// socket a driver creates, <root>/plugins_registry/<driver>-<pod-uid>-reg.sock
// during a rolling update (79 bytes after the root for gpu.tessera.dev), stays
// under the 108-byte AF_UNIX limit.
const maxKubeletRootLen = 28

// MaxNodes is the largest number of kubelet nodes `up` runs.
const MaxNodes = 4

// Layout names every path the cluster uses under its state directory.
type Layout struct {
	StateDir string
}

func (l Layout) path(parts ...string) string {
	return filepath.Join(append([]string{l.StateDir}, parts...)...)
}

func (l Layout) PKIDir() string            { return l.path("pki") }
func (l Layout) LogDir() string            { return l.path("logs") }
func (l Layout) EtcdDataDir() string       { return l.path("etcd") }
func (l Layout) AdminKubeconfig() string   { return l.path("kubeconfig") }
func (l Layout) EnvFile() string           { return l.path("env") }
func (l Layout) PlanFile() string          { return l.path("plan.json") }
func (l Layout) StatusFile() string        { return l.path("status") }
func (l Layout) SupervisorPIDFile() string { return l.path("supervisor.pid") }
func (l Layout) PIDDir() string            { return l.path("pids") }
func (l Layout) ConfigDir() string         { return l.path("config") }
func (l Layout) KubeProxyConfig() string   { return l.path("config", "kube-proxy.yaml") }
func (l Layout) LogFile(component string) string {
	return filepath.Join(l.LogDir(), component+".log")
}
func (l Layout) Kubeconfig(identity string) string {
	return filepath.Join(l.ConfigDir(), identity+".kubeconfig")
}

// Node describes one kubelet node and the paths it owns.
type Node struct {
	Index int
	Name  string
	// KubeletRoot is the kubelet's --root-dir. It is deliberately short (see
	// maxKubeletRootLen) and holds plugins_registry/ and plugins/.
	KubeletRoot string
	// Dir holds everything else of the node: configs, CRI socket, records.
	Dir string
}

// NodeName is the Kubernetes node name of the i-th node (1-based).
func NodeName(i int) string { return fmt.Sprintf("tessera-node-%d", i) }

// Containerd returns the containerd directories of the node with 1-based
// index i (DIR/c<i>, kept short for the shims' socket paths).
func (l Layout) Containerd(i int) ContainerdPaths {
	return ContainerdPaths{Dir: l.path(fmt.Sprintf("c%d", i))}
}

// Node returns the node with 1-based index i.
func (l Layout) Node(i int) Node {
	name := NodeName(i)
	return Node{
		Index:       i,
		Name:        name,
		KubeletRoot: l.path(fmt.Sprintf("k%d", i)),
		Dir:         l.path("nodes", name),
	}
}

func (n Node) RegistrarDir() string  { return filepath.Join(n.KubeletRoot, "plugins_registry") }
func (n Node) PluginsDir() string    { return filepath.Join(n.KubeletRoot, "plugins") }
func (n Node) CRISocket() string     { return filepath.Join(n.Dir, "cri.sock") }
func (n Node) CDIRecordDir() string  { return filepath.Join(n.Dir, "cdi-records") }
func (n Node) CDISpecDir() string    { return filepath.Join(n.Dir, "cdi") }
func (n Node) KubeletConfig() string { return filepath.Join(n.Dir, "kubelet.yaml") }
func (n Node) PodLogsDir() string    { return filepath.Join(n.Dir, "pod-logs") }

// KubeletWorkDir is the kubelet's working directory, kept empty on purpose:
// when container GC removes a container, the kubelet's log manager deletes
// every match of Glob(status.logPath + "*"); the fake runtime reports an empty
// log path, so that is every entry of the working directory (with the state
// dir as working directory it deleted the .tessera-cluster marker).
func (n Node) KubeletWorkDir() string   { return filepath.Join(n.Dir, "kubelet-cwd") }
func (n Node) KubeletComponent() string { return n.Name + "-kubelet" }
func (n Node) CRIComponent() string     { return n.Name + "-fake-cri" }

// ContainerdComponent and ImagesComponent name node's containerd and the
// one-shot import of the cluster's images into it.
func (n Node) ContainerdComponent() string { return n.Name + "-containerd" }
func (n Node) ImagesComponent() string     { return n.Name + "-images" }
