// Command tessera-cluster runs the local test cluster: up, down, smoke, and
// supervise (started by up). The bash wrappers in tests/cluster call it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"tessera.dev/tests/cluster/internal/harness"
)

const defaultStateDir = "/tmp/tessera-cluster"

func main() {
	logger := log.New(os.Stderr, "tessera-cluster: ", 0)
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "up":
		err = up(ctx, args, logger)
	case "down":
		err = down(args, logger)
	case "smoke":
		err = smoke(ctx, args, logger)
	case "images":
		err = images(ctx, args, logger)
	case "cri-cleanup":
		fs := flag.NewFlagSet("cri-cleanup", flag.ExitOnError)
		socket := fs.String("socket", "", "the CRI socket (a node's containerd)")
		_ = fs.Parse(args)
		err = harness.CRICleanup(ctx, *socket, logger)
	case "supervise":
		fs := flag.NewFlagSet("supervise", flag.ExitOnError)
		stateDir := fs.String("state-dir", defaultStateDir, "cluster state directory")
		_ = fs.Parse(args)
		stop() // the supervisor handles SIGTERM/SIGINT itself
		err = harness.Supervise(*stateDir)
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		logger.Printf("%s: %v", cmd, err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: tessera-cluster COMMAND [flags]
  up     [--nodes N] [--runtime containerd|fake] [--image ARCHIVE]... [--state-dir DIR] [--bin-dir DIR] [--timeout D]
                                   boot the cluster, print the kubeconfig path
  down   [--state-dir DIR] [--purge]  stop the cluster, clean up, check nothing is left on the host
  smoke  [--state-dir DIR]          run the smoke checks against a running cluster
  images build --ref REF --out FILE [--file SRC:DST[:MODE]]... [--content DST:TEXT[:MODE]]... [--dir DST[:MODE]]...
               [--symlink DST:TARGET]... [--entrypoint ARG]... [--cmd ARG]... [--env K=V]... [--user U] [--workdir D]
               [--platform amd64|arm64]
                                   write an OCI archive (kept when FILE.key says its inputs are unchanged)
  images index --ref REF --out FILE ARCHIVE...
                                   combine single-platform archives into one multi-platform image
  images import (--state-dir DIR | --address SOCKET --ctr CTR) ARCHIVE...
                                   import archives into every node's (or one) containerd
  cri-cleanup --socket SOCKET       stop and remove every pod sandbox of a CRI runtime
`)
}

func up(ctx context.Context, args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	nodes := fs.Int("nodes", 1, "number of kubelet nodes (1-4)")
	stateDir := fs.String("state-dir", defaultStateDir, "cluster state directory (keep it short: kubelet socket paths live under it)")
	self, _ := os.Executable()
	binDir := fs.String("bin-dir", filepath.Dir(self), "directory holding the component symlinks (kube-apiserver, kubelet, ...)")
	timeout := fs.Duration("timeout", 4*time.Minute, "how long to wait for the cluster to be ready")
	runtime := fs.String("runtime", harness.RuntimeContainerd, "container runtime of the nodes: containerd (real containers) or fake (the recording fake CRI)")
	var images stringList
	fs.Var(&images, "image", "an OCI archive every node's containerd imports before its kubelet starts (repeatable)")
	_ = fs.Parse(args)
	start := time.Now()
	kubeconfig, err := harness.Up(ctx, harness.UpOptions{
		StateDir:          *stateDir,
		BinDir:            *binDir,
		Nodes:             *nodes,
		Timeout:           *timeout,
		ExtraFeatureGates: os.Getenv("TESSERA_EXTRA_FEATURE_GATES"),
		RuntimeConfig:     os.Getenv("TESSERA_RUNTIME_CONFIG"),
		Runtime:           *runtime,
		Images:            images,
		Logger:            logger,
	})
	if err != nil {
		return err
	}
	logger.Printf("cluster ready in %.1fs; env file %s", time.Since(start).Seconds(), filepath.Join(*stateDir, "env"))
	fmt.Println(kubeconfig)
	return nil
}

func down(args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	stateDir := fs.String("state-dir", defaultStateDir, "cluster state directory")
	purge := fs.Bool("purge", false, "also delete logs and container records")
	_ = fs.Parse(args)
	return harness.Down(harness.DownOptions{StateDir: *stateDir, Purge: *purge, Logger: logger})
}

func smoke(ctx context.Context, args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("smoke", flag.ExitOnError)
	stateDir := fs.String("state-dir", defaultStateDir, "cluster state directory")
	_ = fs.Parse(args)
	return harness.Smoke(ctx, harness.SmokeOptions{StateDir: *stateDir, Logger: logger})
}
