// Command pause is the local cluster's pod sandbox process: the first process
// of every pod's namespaces. It reaps the children that get reparented to it,
// sleeps otherwise, and exits 0 on SIGTERM or SIGINT (exit 2 on anything
// else it cannot handle). Built statically (no cgo) into the pause image,
// which the cluster imports under the upstream image's name because no
// registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not running as PID 1\n")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
	os.Exit(2)
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
