package harness

import (
	"fmt"
	"os"
	"strconv"
)

func loopbackURL(scheme string, port int, path string) string {
	return fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, port, path)
}

// buildComponents fills plan.Components: etcd, then the API server, then the
// fake runtimes, then controller-manager and scheduler with the first kubelet,
// then the other kubelets one at a time.
//
// The kubelets start one after the other because they share one directory no
// flag moves: the device plugin manager's /var/lib/kubelet/device-plugins/.
// At start a kubelet empties it and listens on kubelet.sock there; two doing it
// at once fail with "address already in use" and the loser exits ("Failed to
// start ContainerManager"). A kubelet reports its node Ready only after that
// step, so each waits for the previous one's node to be Ready.
func buildComponents(plan *Plan, layout Layout, pki *PKI) {
	gates := FeatureGateFlag(plan.FeatureGates)
	ports := plan.Ports
	var cs []Component
	add := func(c Component) {
		c.LogFile = layout.LogFile(c.Name)
		c.PIDFile = layout.PIDDir() + "/" + c.Name + ".pid"
		if c.WorkingDirPath == "" {
			c.WorkingDirPath = layout.StateDir
		}
		if c.StartTimeoutS == 0 {
			c.StartTimeoutS = 90
		}
		if c.StopTimeoutS == 0 {
			c.StopTimeoutS = 15
		}
		cs = append(cs, c)
	}

	etcdClient := loopbackURL("http", ports.EtcdClient, "")
	etcdPeer := loopbackURL("http", ports.EtcdPeer, "")
	add(Component{
		Name:  "etcd",
		Stage: 0,
		Args: []string{
			plan.bin("etcd"),
			"--name=tessera",
			"--data-dir=" + layout.EtcdDataDir(),
			"--listen-client-urls=" + etcdClient,
			"--advertise-client-urls=" + etcdClient,
			"--listen-peer-urls=" + etcdPeer,
			"--initial-advertise-peer-urls=" + etcdPeer,
			"--initial-cluster=tessera=" + etcdPeer,
			"--initial-cluster-state=new",
			// A throw-away test cluster: skip fsync, it dominates etcd latency on CI disks.
			"--unsafe-no-fsync=true",
			"--log-level=warn",
		},
		Probe: Probe{Kind: "http", URL: etcdClient + "/health"},
	})

	add(Component{
		Name:  "kube-apiserver",
		Stage: 1,
		Args: append([]string{
			plan.bin("kube-apiserver"),
			"--etcd-servers=" + etcdClient,
			"--bind-address=" + plan.APIServerHost(),
			"--advertise-address=" + plan.APIServerHost(),
			"--secure-port=" + strconv.Itoa(ports.APIServer),
			"--tls-cert-file=" + pki.ServingCert(),
			"--tls-private-key-file=" + pki.ServingKey(),
			"--client-ca-file=" + pki.CACert(),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + pki.ServiceAccountPubKey(),
			"--service-account-signing-key-file=" + pki.ServiceAccountKey(),
			"--service-cluster-ip-range=" + serviceCIDR,
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true",
			"--kubelet-client-certificate=" + pki.ClientCert(APIServerKubeletClient),
			"--kubelet-client-key=" + pki.ClientKey(APIServerKubeletClient),
			// Aggregated APIs (see FrontProxyClient).
			"--proxy-client-cert-file=" + pki.ClientCert(FrontProxyClient),
			"--proxy-client-key-file=" + pki.ClientKey(FrontProxyClient),
			"--requestheader-client-ca-file=" + pki.CACert(),
			"--requestheader-allowed-names=" + FrontProxyClient.User,
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--feature-gates=" + gates,
			"--profiling=false",
			"--v=1",
		}, append(apiServerNetworkArgs(plan.Runtime), runtimeConfigArgs(plan.RuntimeConfig)...)...),
		Probe:         Probe{Kind: "https-client", URL: plan.APIServerURL() + "/readyz"},
		StartTimeoutS: 120,
	})

	// The stage of the controller-manager, the scheduler and the first kubelet.
	kubeletStage := 3
	if plan.Runtime == RuntimeContainerd {
		kubeletStage = 4
		for _, c := range containerdComponents(plan, layout) {
			add(c)
		}
		// kube-proxy starts once the first node (whose name it runs as) is
		// Ready: one that starts before its node exists exits as soon as the
		// node's addresses appear ("NodeIPs changed"), expecting a restart.
		add(Component{
			Name:  "kube-proxy",
			Stage: kubeletStage + 1,
			Args: []string{
				plan.bin("kube-proxy"),
				"--config=" + layout.KubeProxyConfig(),
				"--v=1",
			},
			// /healthz also wants the node's ready state; /livez says the
			// proxier has synced its rules.
			Probe: Probe{Kind: "http", URL: loopbackURL("http", plan.Ports.KubeProxyHealthz, "/livez")},
		})
	} else {
		for i := 1; i <= plan.Nodes; i++ {
			node := layout.Node(i)
			add(Component{
				Name:  node.CRIComponent(),
				Stage: 2,
				Args: []string{
					plan.bin("fake-cri"),
					"--socket=" + node.CRISocket(),
					"--record-dir=" + node.CDIRecordDir(),
					"--node=" + node.Name,
					"--image-fs-dir=" + node.Dir,
				},
				Probe: Probe{Kind: "unix", Path: node.CRISocket()},
			})
		}
	}

	kcmConfig := layout.Kubeconfig(ControllerManagerIdentity.File)
	add(Component{
		Name:  "kube-controller-manager",
		Stage: kubeletStage,
		Args: []string{
			plan.bin("kube-controller-manager"),
			"--kubeconfig=" + kcmConfig,
			"--authentication-kubeconfig=" + kcmConfig,
			"--authorization-kubeconfig=" + kcmConfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports.ControllerManager),
			"--leader-elect=false",
			"--use-service-account-credentials=true",
			"--service-account-private-key-file=" + pki.ServiceAccountKey(),
			"--root-ca-file=" + pki.CACert(),
			"--cluster-signing-cert-file=" + pki.CACert(),
			"--cluster-signing-key-file=" + pki.CAKey(),
			"--feature-gates=" + gates,
			"--profiling=false",
			"--v=1",
		},
		Probe: Probe{Kind: "https-insecure", URL: loopbackURL("https", ports.ControllerManager, "/healthz")},
	})

	schedConfig := layout.Kubeconfig(SchedulerIdentity.File)
	add(Component{
		Name:  "kube-scheduler",
		Stage: kubeletStage,
		Args: []string{
			plan.bin("kube-scheduler"),
			"--kubeconfig=" + schedConfig,
			"--authentication-kubeconfig=" + schedConfig,
			"--authorization-kubeconfig=" + schedConfig,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports.Scheduler),
			"--leader-elect=false",
			"--feature-gates=" + gates,
			"--profiling=false",
			"--v=2",
		},
		Probe: Probe{Kind: "https-insecure", URL: loopbackURL("https", ports.Scheduler, "/healthz")},
	})

	for i := 1; i <= plan.Nodes; i++ {
		node := layout.Node(i)
		add(Component{
			Name:  node.KubeletComponent(),
			Stage: kubeletStage + i - 1,
			Args: append([]string{
				plan.bin("kubelet"),
				"--config=" + node.KubeletConfig(),
				"--kubeconfig=" + layout.Kubeconfig(NodeIdentity(node.Name).File),
				"--root-dir=" + node.KubeletRoot,
				"--cert-dir=" + node.Dir + "/kubelet-pki",
				"--hostname-override=" + node.Name,
				"--node-labels=tessera.dev/test-node=" + node.Name,
				"--v=2",
				// Log the DRA plugin manager's ResourceSlice wipes; `up` waits for the start-up one.
				"--vmodule=dra_plugin_manager=3",
			}, kubeletNetworkArgs(plan.Runtime)...),
			Probe:          Probe{Kind: "node-ready", URL: plan.APIServerURL() + "/api/v1/nodes/" + node.Name},
			WorkingDirPath: node.KubeletWorkDir(),
			StopTimeoutS:   20,
		})
	}
	plan.Components = cs
}

// apiServerNetworkArgs: with containerd the API server advertises the bridge
// address, so the `kubernetes` service gets a real endpoint (the default lease
// reconciler), and reaches the kubelets at their InternalIP (node names do not
// resolve). With the fake runtime it listens on loopback, which Endpoints
// refuse: no reconciler, and nothing reaches it through the service.
func apiServerNetworkArgs(runtime string) []string {
	if runtime == RuntimeContainerd {
		return []string{"--kubelet-preferred-address-types=InternalIP"}
	}
	return []string{"--endpoint-reconciler-type=none"}
}

// kubeletNetworkArgs: with containerd every kubelet reports the bridge address
// as its InternalIP (the API server reaches it there for logs and exec).
func kubeletNetworkArgs(runtime string) []string {
	if runtime == RuntimeContainerd {
		return []string{"--node-ip=" + BridgeIP.String()}
	}
	return nil
}

// containerdComponents are, with the containerd runtime: each node's
// containerd (stage 2), then the import of the cluster's images into each
// containerd (stage 3, one-shot).
func containerdComponents(plan *Plan, layout Layout) []Component {
	var cs []Component
	for i := 1; i <= plan.Nodes; i++ {
		node := layout.Node(i)
		paths := layout.Containerd(i)
		cs = append(cs, Component{
			Name:  node.ContainerdComponent(),
			Stage: 2,
			Args:  []string{plan.bin("containerd"), "--config=" + paths.Config()},
			// The shims must find containerd-shim-runc-v2 and runc on PATH.
			ExtraEnv: []string{"PATH=" + plan.BinDir + ":/usr/local/sbin:/usr/sbin:/sbin:" + os.Getenv("PATH")},
			Probe:    Probe{Kind: "unix", Path: paths.Socket()},
			StopHook: []string{plan.bin("tessera-cluster"), "cri-cleanup", "--socket=" + paths.Socket()},
			// Stopping lets containerd finish its shims' bookkeeping.
			StopTimeoutS: 20,
		})
		args := []string{plan.bin("tessera-cluster"), "images", "import", "--ctr=" + plan.bin("ctr"), "--address=" + paths.Socket()}
		cs = append(cs, Component{
			Name:          node.ImagesComponent(),
			Stage:         3,
			Args:          append(args, plan.Images...),
			OneShot:       true,
			StartTimeoutS: 120,
		})
	}
	return cs
}

func runtimeConfigArgs(extra string) []string {
	return []string{"--runtime-config=" + RuntimeConfigFlag(extra)}
}
