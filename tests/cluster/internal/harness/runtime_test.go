package harness

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestContainerdComponentsStartBetweenTheAPIServerAndTheKubelets(t *testing.T) {
	plan, _ := testPlanWith(t, 2, RuntimeContainerd)
	stage := map[string]int{}
	byName := map[string]Component{}
	for _, c := range plan.Components {
		stage[c.Name] = c.Stage
		byName[c.Name] = c
	}
	order := [][2]string{
		{"kube-apiserver", "tessera-node-1-containerd"},
		{"tessera-node-1-kubelet", "kube-proxy"},
		{"tessera-node-1-containerd", "tessera-node-1-images"},
		{"tessera-node-2-images", "tessera-node-1-kubelet"},
		{"tessera-node-1-kubelet", "tessera-node-2-kubelet"},
	}
	for _, o := range order {
		if _, ok := stage[o[0]]; !ok {
			t.Fatalf("no component %s in %v", o[0], stage)
		}
		if stage[o[0]] >= stage[o[1]] {
			t.Errorf("%s (stage %d) must start before %s (stage %d)", o[0], stage[o[0]], o[1], stage[o[1]])
		}
	}
	if !byName["tessera-node-1-images"].OneShot {
		t.Error("the image import must be a one-shot component")
	}
	hook := strings.Join(byName["tessera-node-2-containerd"].StopHook, " ")
	if !strings.Contains(hook, "cri-cleanup --socket=/tmp/tessera-cluster/c2/sock") {
		t.Errorf("containerd of node 2 must remove its sandboxes before it stops; stop hook %q", hook)
	}
	for _, c := range plan.Components {
		if strings.HasSuffix(c.Name, "-fake-cri") {
			t.Errorf("a containerd cluster runs no fake CRI, got %s", c.Name)
		}
	}
	api := strings.Join(byName["kube-apiserver"].Args, " ")
	for _, want := range []string{"--bind-address=10.244.0.1", "--advertise-address=10.244.0.1", "--kubelet-preferred-address-types=InternalIP"} {
		if !strings.Contains(api, want) {
			t.Errorf("API server args lack %s: %s", want, api)
		}
	}
	if strings.Contains(api, "endpoint-reconciler-type=none") {
		t.Error("with containerd the `kubernetes` service needs its endpoint reconciled")
	}
	if !strings.Contains(strings.Join(byName["tessera-node-1-kubelet"].Args, " "), "--node-ip=10.244.0.1") {
		t.Error("kubelets must report the bridge address as their InternalIP")
	}
	if got := plan.APIServerURL(); !strings.HasPrefix(got, "https://10.244.0.1:") {
		t.Errorf("API server URL %s, want the bridge address", got)
	}
}

func TestFakeRuntimeKeepsEverythingOnLoopback(t *testing.T) {
	plan, _ := testPlan(t, 1)
	if got := plan.APIServerURL(); !strings.HasPrefix(got, "https://127.0.0.1:") {
		t.Errorf("API server URL %s, want loopback", got)
	}
	for _, c := range plan.Components {
		if c.Name == "kube-proxy" || strings.HasSuffix(c.Name, "-containerd") {
			t.Errorf("the fake runtime runs no %s", c.Name)
		}
	}
}

func TestParseRuntime(t *testing.T) {
	for in, want := range map[string]string{"": RuntimeContainerd, "fake": RuntimeFake, "containerd": RuntimeContainerd} {
		if got, err := ParseRuntime(in); err != nil || got != want {
			t.Errorf("ParseRuntime(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseRuntime("docker"); err == nil || !strings.Contains(err.Error(), "containerd") {
		t.Errorf("an unknown runtime must be refused with the choices named, got %v", err)
	}
}

func TestContainerdConfigKeepsEveryPathOfItsOwn(t *testing.T) {
	p := Layout{StateDir: "/tmp/rt"}.Containerd(2)
	cfg := containerdConfig(p, "/tmp/rt/nodes/tessera-node-2/cdi", CNIBinDirs)
	for _, want := range []string{
		`root = "/tmp/rt/c2/root"`, `state = "/tmp/rt/c2/state"`, `address = "/tmp/rt/c2/sock"`,
		`address = "/tmp/rt/c2/ttrpc"`, `socket_dir = "/tmp/rt/c2/s"`, `Root = "/tmp/rt/c2/runc"`,
		`path = "/tmp/rt/c2/opt"`, `conf_dir = "/tmp/rt/c2/cni"`,
		`cdi_spec_dirs = ["/tmp/rt/nodes/tessera-node-2/cdi"]`,
		"restrict_oom_score_adj = true", "netns_mounts_under_state_dir = true",
		"[plugins.'io.containerd.nri.v1.nri']\n  disable = true",
		`sandbox = "registry.k8s.io/pause:3.10"`,
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("containerd config lacks %s:\n%s", want, cfg)
		}
	}
	// A shim socket is <socket_dir>/<64 hex digits>; with the longest state dir up accepts it must fit.
	long := Layout{StateDir: strings.Repeat("d", 25)}.Containerd(4)
	if n := len(long.ShimDir()) + 1 + 64; n > 107 {
		t.Errorf("shim socket paths are %d bytes, over the unix socket limit", n)
	}
}

func TestCNINetworksShareTheBridgeWithDisjointRanges(t *testing.T) {
	type rng struct{ Subnet, RangeStart, RangeEnd, Gateway string }
	var seen []rng
	for i := 1; i <= MaxNodes; i++ {
		data, err := cniConfig(i, "/ipam")
		if err != nil {
			t.Fatal(err)
		}
		var conf struct {
			Name    string
			Plugins []struct {
				Type   string
				Bridge string
				IPMasq bool
				IPAM   struct {
					Type    string
					DataDir string
					Ranges  [][]rng
				}
			}
		}
		if err := json.Unmarshal(data, &conf); err != nil {
			t.Fatal(err)
		}
		if conf.Name != CNINetworkName || len(conf.Plugins) != 1 || conf.Plugins[0].Bridge != BridgeName || conf.Plugins[0].IPMasq {
			t.Fatalf("node %d: unexpected network %s", i, data)
		}
		r := conf.Plugins[0].IPAM.Ranges[0][0]
		if r.Gateway != BridgeIP.String() || r.Subnet != "10.244.0.0/16" || conf.Plugins[0].IPAM.DataDir != "/ipam" {
			t.Errorf("node %d: range %+v", i, r)
		}
		for _, other := range seen {
			if other.RangeStart == r.RangeStart {
				t.Errorf("node %d shares its range with another node: %+v", i, r)
			}
		}
		seen = append(seen, r)
	}
}

func TestKubeChainsAreFoundInAnyTable(t *testing.T) {
	ruleset := `table ip filter {
	chain KUBE-FIREWALL {
	}
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
}
table ip kube-proxy {
	chain KUBE-SERVICES {
	}
}
table inet other {
	chain input {
	}
}
`
	got := strings.Join(kubeChains(ruleset), ", ")
	if got != "ip filter KUBE-FIREWALL, ip kube-proxy KUBE-SERVICES" {
		t.Errorf("kubeChains = %q", got)
	}
	if len(kubeChains("table inet x {\n}\n")) != 0 {
		t.Error("a ruleset without KUBE- chains has none")
	}
}

func TestNewChainsIgnoresTheBaseline(t *testing.T) {
	dir := t.TempDir()
	chains := []string{"ip filter KUBE-FIREWALL", "ip kube-proxy KUBE-SERVICES", "ip nat KUBE-KUBELET-CANARY"}
	if got := strings.Join(newChains(chains, dir), ", "); got != "ip kube-proxy KUBE-SERVICES" {
		t.Errorf("without a baseline only kube-proxy's chains are ours, got %q", got)
	}
	if err := os.WriteFile(filepath.Join(dir, hostChainsBaseline), []byte("ip filter KUBE-FIREWALL\nip nat KUBE-KUBELET-CANARY"), 0o644); err != nil {
		t.Fatal(err)
	}
	chains = append(chains, "ip mangle KUBE-KUBELET-CANARY")
	if got := strings.Join(newChains(chains, dir), ", "); got != "ip kube-proxy KUBE-SERVICES, ip mangle KUBE-KUBELET-CANARY" {
		t.Errorf("chains not in the baseline are reported, got %q", got)
	}
}
