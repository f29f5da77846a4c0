package harness

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// kubeletConfig is the KubeletConfiguration of one node. The choices that make
// a real kubelet run without a container engine, systemd or a writable cgroup
// tree of its own:
//   - cgroupsPerQOS false and enforceNodeAllocatable []: the kubelet creates no
//     cgroups (nothing runs in the fake runtime anyway);
//   - failCgroupV1 false: CI machines may still mount cgroup v1;
//   - failSwapOn false: do not insist swap is off;
//   - anonymous authentication with AlwaysAllow authorization: the API server
//     does not need to be a webhook authorizer for the kubelet;
//   - eviction thresholds and image GC effectively off, so a nearly full CI
//     disk never taints the node;
//   - healthz listens on 127.0.0.1; the server (logs, exec) on address:
//     127.0.0.1 with the fake runtime, the pod bridge's address with
//     containerd, where the API server reaches it;
//   - makeIPTablesUtilChains false: the kubelet adds no iptables chains to
//     the host;
//   - syncFrequency 10s: a pod whose DRA prepare failed (say, the plugin was
//     restarting) is retried only at its next periodic sync — the kubelet
//     returns from that sync without an error, so no 10 s error back-off
//     applies — which by default comes 60 to 90 s later.
func kubeletConfig(node Node, ports NodePorts, criSocket, address, caFile string, gates map[string]bool) map[string]any {
	endpoint := "unix://" + criSocket
	return map[string]any{
		"apiVersion":         "kubelet.config.k8s.io/v1beta1",
		"kind":               "KubeletConfiguration",
		"address":            address,
		"port":               ports.Server,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        ports.Healthz,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": caFile},
		},
		"authorization":            map[string]any{"mode": "AlwaysAllow"},
		"cgroupDriver":             "cgroupfs",
		"cgroupsPerQOS":            false,
		"enforceNodeAllocatable":   []string{},
		"failSwapOn":               false,
		"failCgroupV1":             false,
		"containerRuntimeEndpoint": endpoint,
		"imageServiceEndpoint":     endpoint,
		"podLogsDir":               node.PodLogsDir(),
		"featureGates":             gates,
		"evictionHard": map[string]string{
			"memory.available":  "1Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
		"resolvConf":                  "",
		"clusterDomain":               "cluster.local",
		"clusterDNS":                  []string{"10.0.0.10"},
		"registerNode":                true,
		// No KUBE-FIREWALL / canary chains in the host's iptables: nothing
		// here needs them, and `down` must leave no rule behind.
		"makeIPTablesUtilChains":    false,
		"nodeStatusReportFrequency": "10s",
		"syncFrequency":             "10s",
	}
}

// writeKubeletConfig writes a component config (kubelet, kube-proxy) as YAML.
func writeKubeletConfig(path string, cfg map[string]any) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode component config %s: %w", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write component config %s: %w", path, err)
	}
	return nil
}
