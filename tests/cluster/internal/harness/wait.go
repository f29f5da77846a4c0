package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// waitClusterReady waits for the supervisor to report all components up, then
// for what a workload needs: every node Ready, and the default namespace's
// service account and root CA config map (pods are rejected, or stuck in
// ContainerCreating, without them).
func waitClusterReady(ctx context.Context, layout Layout, plan *Plan, timeout time.Duration, logger *log.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := waitSupervisorRunning(ctx, layout); err != nil {
		return err
	}
	client, err := NewClient(layout.AdminKubeconfig())
	if err != nil {
		return err
	}
	want := make([]string, 0, plan.Nodes)
	for i := 1; i <= plan.Nodes; i++ {
		want = append(want, NodeName(i))
	}
	logger.Printf("components are up; waiting for nodes %v to be Ready", want)
	var lastProblem string
	for {
		problem, err := clusterProblem(ctx, client, want)
		if err == nil && problem == "" {
			problem = startupWipePending(layout, plan.Nodes)
		}
		if err == nil && problem == "" {
			return nil
		}
		if err != nil {
			problem = err.Error()
		}
		if problem != lastProblem {
			logger.Printf("waiting: %s", problem)
			lastProblem = problem
		}
		if st, err := readStatus(layout.StatusFile()); err == nil && st.State != StateRunning {
			return fmt.Errorf("cluster %s: %s%s", st.State, st.Message, logTail(st.LogFile))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready after %s: %s (logs in %s)", timeout, problem, layout.LogDir())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// startupWipeLogLine is what a kubelet logs (at -v=3 for the DRA plugin
// manager, see the kubelet's --vmodule) once it has deleted its node's
// ResourceSlices at start-up. A driver that publishes before that loses its
// slices, so `up` returns only after every kubelet did it.
const startupWipeLogLine = "Deleted ResourceSlices"

// startupWipePending names the first kubelet whose start-up wipe of
// ResourceSlices has not happened yet, or returns "".
func startupWipePending(layout Layout, nodes int) string {
	for i := 1; i <= nodes; i++ {
		node := layout.Node(i)
		data, err := os.ReadFile(layout.LogFile(node.KubeletComponent()))
		if err != nil || !bytes.Contains(data, []byte(startupWipeLogLine)) {
			return fmt.Sprintf("kubelet of %s has not wiped its stale ResourceSlices yet", node.Name)
		}
	}
	return ""
}

// clusterProblem names the first thing not ready yet, or returns "".
func clusterProblem(ctx context.Context, client kubernetes.Interface, nodes []string) (string, error) {
	for _, name := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("node %s is not registered yet", name), nil
		}
		if err != nil {
			return "", err
		}
		if !nodeReady(node) {
			return fmt.Sprintf("node %s is not Ready yet", name), nil
		}
	}
	if _, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
		return "service account default/default does not exist yet", nil //nolint:nilerr // not-yet is the answer
	}
	if _, err := client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		return "config map default/kube-root-ca.crt does not exist yet", nil //nolint:nilerr // not-yet is the answer
	}
	return "", nil
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitSupervisorRunning(ctx context.Context, layout Layout) error {
	for {
		st, err := readStatus(layout.StatusFile())
		switch {
		case err == nil && (st.State == StateRunning):
			return nil
		case err == nil && (st.State == StateFailed || st.State == StateStopped || st.State == StateDegraded):
			return fmt.Errorf("cluster start-up failed: %s%s", st.Message, logTail(st.LogFile))
		case err != nil && !errors.Is(err, os.ErrNotExist):
			return err
		}
		if _, alive := supervisorPID(layout); !alive && err == nil && st.State == StateStarting {
			return fmt.Errorf("the supervisor died during start-up%s", logTail(layout.LogFile("supervisor")))
		}
		select {
		case <-ctx.Done():
			state := "no status yet"
			if err == nil {
				state = st.State
			}
			return fmt.Errorf("components not up in time (supervisor state: %s); see %s%s",
				state, layout.LogFile("supervisor"), logTail(layout.LogFile("supervisor")))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// NewClient builds a clientset from a kubeconfig file.
func NewClient(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client from %s: %w", kubeconfig, err)
	}
	return client, nil
}

// logTail formats the last lines of a log for an error message.
func logTail(path string) string {
	if path == "" {
		return ""
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > 25 {
		lines = lines[len(lines)-25:]
	}
	return fmt.Sprintf("\n--- last lines of %s ---\n%s", path, strings.TrimRight(string(bytes.Join(lines, []byte("\n"))), "\n"))
}
