package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// EnvFileVars lists the env file's variables in order. Values never contain
// spaces except TESSERA_NODES, which is quoted, so the file can be sourced by
// bash or split on the first '=' per line.
func EnvFileVars(plan *Plan, layout Layout) [][2]string {
	vars := [][2]string{
		{"TESSERA_CLUSTER_STATE_DIR", layout.StateDir},
		{"KUBECONFIG", layout.AdminKubeconfig()},
		{"TESSERA_KUBE_VERSION", plan.KubeVersion},
		{"TESSERA_API_SERVER", plan.APIServerURL()},
		{"TESSERA_CA_FILE", (&PKI{Dir: layout.PKIDir()}).CACert()},
		{"TESSERA_FEATURE_GATES", FeatureGateFlag(plan.FeatureGates)},
		{"TESSERA_LOG_DIR", layout.LogDir()},
		{"TESSERA_NODE_COUNT", strconv.Itoa(plan.Nodes)},
		{"TESSERA_RUNTIME", plan.Runtime},
	}
	names := make([]string, 0, plan.Nodes)
	for i := 1; i <= plan.Nodes; i++ {
		names = append(names, NodeName(i))
	}
	vars = append(vars, [2]string{"TESSERA_NODES", strings.Join(names, " ")})
	for _, c := range plan.Components {
		if c.Stage <= 1 || c.Name == "kube-controller-manager" || c.Name == "kube-scheduler" {
			vars = append(vars, [2]string{"TESSERA_LOG_" + envName(c.Name), c.LogFile})
		}
	}
	for i := 1; i <= plan.Nodes; i++ {
		node := layout.Node(i)
		p := "TESSERA_NODE_" + strconv.Itoa(i) + "_"
		vars = append(vars,
			[2]string{p + "NAME", node.Name},
			[2]string{p + "KUBELET_ROOT", node.KubeletRoot},
			[2]string{p + "REGISTRAR_DIR", node.RegistrarDir()},
			[2]string{p + "PLUGINS_DIR", node.PluginsDir()},
			[2]string{p + "CDI_SPEC_DIR", node.CDISpecDir()},
		)
		// The fake runtime's container records exist only with the fake runtime:
		// with containerd, containers run and the suite reads their logs.
		if plan.Runtime == RuntimeContainerd {
			vars = append(vars,
				[2]string{p + "CRI_SOCKET", layout.Containerd(i).Socket()},
				[2]string{p + "CRI_LOG", layout.LogFile(node.ContainerdComponent())},
			)
		} else {
			vars = append(vars,
				[2]string{p + "CDI_RECORD_DIR", node.CDIRecordDir()},
				[2]string{p + "CRI_SOCKET", node.CRISocket()},
				[2]string{p + "CRI_LOG", layout.LogFile(node.CRIComponent())},
			)
		}
		vars = append(vars,
			[2]string{p + "KUBECONFIG", layout.Kubeconfig(NodeIdentity(node.Name).File)},
			[2]string{p + "KUBELET_LOG", layout.LogFile(node.KubeletComponent())},
		)
	}
	return vars
}

func envName(component string) string {
	return strings.ToUpper(strings.ReplaceAll(component, "-", "_"))
}

func writeEnvFile(path string, vars [][2]string) error {
	var b strings.Builder
	b.WriteString("# Written by tests/cluster/up. Source it from bash, or read KEY=VALUE lines\n")
	b.WriteString("# (values are single-quoted only when they contain spaces).\n")
	for _, kv := range vars {
		value := kv[1]
		if strings.ContainsAny(value, " \t") {
			value = "'" + value + "'"
		}
		fmt.Fprintf(&b, "%s=%s\n", kv[0], value)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write env file %s: %w", path, err)
	}
	return nil
}
