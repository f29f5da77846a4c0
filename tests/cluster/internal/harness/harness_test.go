package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFeatureGatesOverlaysBase(t *testing.T) {
	got, err := ParseFeatureGates(map[string]bool{"A": true, "B": true}, " B=false, C=true ,")
	if err != nil {
		t.Fatal(err)
	}
	if FeatureGateFlag(got) != "A=true,B=false,C=true" {
		t.Fatalf("got %s", FeatureGateFlag(got))
	}
}

func TestParseFeatureGatesRejectsWhatTheComponentsWould(t *testing.T) {
	for _, bad := range []string{"A", "A=yes", "=true"} {
		if _, err := ParseFeatureGates(nil, bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: want an error naming it, got %v", bad, err)
		}
	}
}

func testPlan(t *testing.T, nodes int) (*Plan, Layout) {
	t.Helper()
	return testPlanWith(t, nodes, RuntimeFake)
}

func testPlanWith(t *testing.T, nodes int, runtime string) (*Plan, Layout) {
	t.Helper()
	layout := Layout{StateDir: "/tmp/tessera-cluster"}
	ports, err := NewPorts(nodes, runtime)
	if err != nil {
		t.Fatal(err)
	}
	plan := &Plan{KubeVersion: KubeVersion, StateDir: layout.StateDir, BinDir: "/bin-dir", Nodes: nodes, Ports: ports, FeatureGates: FeatureGates, Runtime: runtime}
	buildComponents(plan, layout, &PKI{Dir: layout.PKIDir()})
	return plan, layout
}

func TestEveryKubernetesComponentGetsTheSameFeatureGates(t *testing.T) {
	plan, _ := testPlan(t, 2)
	want := "--feature-gates=" + FeatureGateFlag(FeatureGates)
	seen := 0
	for _, c := range plan.Components {
		if c.Name == "etcd" || strings.HasSuffix(c.Name, "-fake-cri") {
			continue
		}
		seen++
		hasFlag := false
		for _, a := range c.Args {
			hasFlag = hasFlag || a == want
		}
		if !strings.HasSuffix(c.Name, "-kubelet") {
			if !hasFlag {
				t.Errorf("%s: no %s in %v", c.Name, want, c.Args)
			}
			continue
		}
		// The kubelet takes its gates from its config file.
		cfg := kubeletConfig(Node{}, NodePorts{}, "", "127.0.0.1", "", plan.FeatureGates)
		if got := FeatureGateFlag(cfg["featureGates"].(map[string]bool)); got != FeatureGateFlag(FeatureGates) {
			t.Errorf("%s config gates %s, want %s", c.Name, got, FeatureGateFlag(FeatureGates))
		}
	}
	if seen != 5 { // apiserver, controller-manager, scheduler, 2 kubelets
		t.Errorf("saw %d Kubernetes components, want 5", seen)
	}
}

// Tessera's gangs may name an upstream PodGroup: the API server must serve
// scheduling.k8s.io/v1beta1 (a beta API, off unless named) with GenericWorkload
// on, and an extra runtime config must not replace that.
func TestAPIServerServesThePodGroupAPI(t *testing.T) {
	if !FeatureGates["GenericWorkload"] {
		t.Errorf("GenericWorkload is not among the feature gates: %s", FeatureGateFlag(FeatureGates))
	}
	for _, c := range []struct{ extra, want string }{
		{"", "--runtime-config=scheduling.k8s.io/v1beta1=true"},
		{" resource.k8s.io/v1alpha3=true,", "--runtime-config=scheduling.k8s.io/v1beta1=true,resource.k8s.io/v1alpha3=true"},
	} {
		plan, _ := testPlan(t, 1)
		plan.RuntimeConfig = c.extra
		buildComponents(plan, Layout{StateDir: plan.StateDir}, &PKI{Dir: Layout{StateDir: plan.StateDir}.PKIDir()})
		found := false
		for _, comp := range plan.Components {
			if comp.Name != "kube-apiserver" {
				continue
			}
			for _, a := range comp.Args {
				if strings.HasPrefix(a, "--runtime-config") {
					found = true
					if a != c.want {
						t.Errorf("extra %q: API server has %s, want %s", c.extra, a, c.want)
					}
				}
			}
		}
		if !found {
			t.Errorf("extra %q: the API server has no --runtime-config", c.extra)
		}
	}
}

func TestComponentsStartInDependencyOrder(t *testing.T) {
	plan, _ := testPlan(t, 2)
	stage := map[string]int{}
	for _, c := range plan.Components {
		stage[c.Name] = c.Stage
		if filepath.Dir(c.Args[0]) != "/bin-dir" {
			t.Errorf("%s runs %s, want a symlink in the bin dir", c.Name, c.Args[0])
		}
	}
	order := [][2]string{
		{"etcd", "kube-apiserver"},
		{"kube-apiserver", "tessera-node-1-fake-cri"},
		{"tessera-node-2-fake-cri", "tessera-node-2-kubelet"},
		{"kube-apiserver", "kube-scheduler"},
		// Kubelets share /var/lib/kubelet/device-plugins: one at a time.
		{"tessera-node-1-kubelet", "tessera-node-2-kubelet"},
	}
	for _, o := range order {
		if stage[o[0]] >= stage[o[1]] {
			t.Errorf("%s (stage %d) must start before %s (stage %d)", o[0], stage[o[0]], o[1], stage[o[1]])
		}
	}
}

func TestPortsAreDistinct(t *testing.T) {
	p, err := NewPorts(4, RuntimeContainerd)
	if err != nil {
		t.Fatal(err)
	}
	all := []int{p.EtcdClient, p.EtcdPeer, p.APIServer, p.ControllerManager, p.Scheduler, p.KubeProxyHealthz, p.KubeProxyMetrics}
	for _, k := range p.Kubelets {
		all = append(all, k.Server, k.Healthz)
	}
	seen := map[int]bool{}
	for _, port := range all {
		if seen[port] || port == 0 {
			t.Fatalf("ports not distinct and non-zero: %v", all)
		}
		seen[port] = true
	}
}

func TestPluginSocketsFitTheUnixPathLimit(t *testing.T) {
	layout := Layout{StateDir: strings.Repeat("x", maxKubeletRootLen-3)}
	root := layout.Node(MaxNodes).KubeletRoot
	if len(root) > maxKubeletRootLen {
		t.Fatalf("root %s longer than %d", root, maxKubeletRootLen)
	}
	// The longest path a DRA driver creates: a per-pod registration socket
	// during rolling updates, with a 36-character pod UID.
	longest := filepath.Join(layout.Node(MaxNodes).RegistrarDir(), "gpu.tessera.dev-"+strings.Repeat("u", 36)+"-reg.sock")
	if len(longest) >= 108 {
		t.Fatalf("%s is %d bytes, the unix socket limit is 108", longest, len(longest))
	}
}

func TestEnvFileCanBeSourcedAndParsed(t *testing.T) {
	plan, layout := testPlan(t, 2)
	path := filepath.Join(t.TempDir(), "env")
	if err := writeEnvFile(path, EnvFileVars(plan, layout)); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", `set -eu; source "$1"; echo "$KUBECONFIG|$TESSERA_NODES|$TESSERA_NODE_2_REGISTRAR_DIR|$TESSERA_NODE_2_PLUGINS_DIR"`, "bash", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "/tmp/tessera-cluster/kubeconfig|tessera-node-1 tessera-node-2|/tmp/tessera-cluster/k2/plugins_registry|/tmp/tessera-cluster/k2/plugins\n"
	if string(out) != want {
		t.Errorf("sourced %q, want %q", out, want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if k, _, ok := strings.Cut(line, "="); !ok || k == "" || strings.ContainsAny(k, " '") {
			t.Errorf("line %q is not KEY=VALUE", line)
		}
	}
}

func TestUnescapeMountPath(t *testing.T) {
	if got := unescapeMountPath(`/tmp/a\040b/c\134d`); got != `/tmp/a b/c\d` {
		t.Errorf("got %q", got)
	}
}

func TestKubeletsWaitForTheirNodeAndRunInAnEmptyDirectory(t *testing.T) {
	plan, _ := testPlan(t, 2)
	for _, c := range plan.Components {
		if !strings.HasSuffix(c.Name, "-kubelet") {
			continue
		}
		if c.Probe.Kind != "node-ready" {
			t.Errorf("%s probe %q, want node-ready", c.Name, c.Probe.Kind)
		}
		// Its container GC deletes relative paths in its working directory.
		if !strings.HasSuffix(c.WorkingDirPath, "/kubelet-cwd") {
			t.Errorf("%s runs in %s, want its own empty kubelet-cwd", c.Name, c.WorkingDirPath)
		}
	}
}

func TestNodeReadyProbe(t *testing.T) {
	cases := []struct {
		body, wantErr string
	}{
		{`{"metadata":{"name":"n"},"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True"}]}}`, ""},
		{`{"metadata":{"name":"n"},"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady","message":"runtime down"}]}}`, "node n is not Ready: KubeletNotReady (runtime down)"},
		{`{"metadata":{"name":"n"},"status":{}}`, "node n has no Ready condition yet"},
		{`not json`, "decode Node"},
	}
	for _, c := range cases {
		err := nodeReadyJSON([]byte(c.body))
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: error %v, want %q", c.body, err, c.wantErr)
		}
	}
}
