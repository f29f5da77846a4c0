// Command k8s is a multi-call binary holding the real Kubernetes components the
// local test cluster runs, built from the k8s.io/kubernetes Go module. The
// component is chosen by the name the binary is invoked as (argv[0], usually a
// symlink), so each component runs in its own process: signal handling, feature
// gates and flag sets are process-global in these programs.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as the upstream kube-apiserver and kube-controller-manager mains import it.

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as every upstream main registers it.
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as every upstream main registers them.
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as every upstream main registers it.
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"tessera.dev/tests/cluster/internal/fakecri"
)

// components maps an invocation name to the function that runs that component
// and returns its exit code.
var components = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kube-proxy":     func() int { return cli.Run(proxy.NewProxyCommand()) },
	"kubelet":        func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"fake-cri": func() int { return fakecri.Main(os.Args[1:]) },
}

func main() {
	name := filepath.Base(os.Args[0])
	// Also accept `k8s <component> args...`, handy when no symlink exists.
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		if _, ok := components[os.Args[1]]; ok {
			name = os.Args[1]
			os.Args = os.Args[1:]
		}
	}
	run, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "k8s: unknown component %q; invoke this binary as (or pass as first argument) one of: %s\n",
			name, knownComponents())
		os.Exit(2)
	}
	os.Exit(run())
}

func knownComponents() string {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	return fmt.Sprint(names)
}
