package harness

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Smoke namespaces and the fake driver the smoke checks publish devices for.
// No kubelet plugin serves this driver: pods that use its devices get
// scheduled (that is what is checked) but never start.
const (
	smokeNamespace      = "tessera-smoke"
	smokeAdminNamespace = "tessera-smoke-admin"
	smokeDriver         = "smoke.tessera.dev"
	smokeTimeout        = 90 * time.Second
)

// smokeCheck is one named verification against the running cluster.
type smokeCheck struct {
	name string
	run  func(ctx context.Context, s *smoke) error
}

// smoke holds what the checks share.
type smoke struct {
	client kubernetes.Interface
	layout Layout
	node   string // every smoke object targets the first node
	// runtime is the cluster's (RuntimeFake: container records to read).
	runtime string
}

// SmokeOptions configure the smoke checks.
type SmokeOptions struct {
	StateDir string
	Logger   *log.Logger
}

// Smoke runs every check in order against the cluster in the state dir and
// returns an error naming each failed check. Checks build on each other's
// objects only where noted; they run in one namespace which is deleted first
// so the command can be repeated against the same cluster.
func Smoke(ctx context.Context, opts SmokeOptions) error {
	layout := Layout{StateDir: opts.StateDir}
	client, err := NewClient(layout.AdminKubeconfig())
	if err != nil {
		return err
	}
	plan, err := ReadPlan(layout.PlanFile())
	if err != nil {
		return err
	}
	s := &smoke{client: client, layout: layout, node: NodeName(1), runtime: plan.Runtime}
	if err := s.reset(ctx); err != nil {
		return err
	}
	checks := []smokeCheck{
		{"a plain pod reaches Running (fake runtime: its container is recorded; containerd: it runs with a pod IP, and the kubernetes service has an endpoint)", checkPlainPod},
		{"the scheduler allocates a ResourceClaim from a hand-made ResourceSlice", checkAllocation},
		{"device taints are kept by the API server and honoured by the scheduler", checkDeviceTaints},
		{"partitionable devices: shared counters are kept and enforced", checkPartitionable},
		{"consumable capacity: one device is shared by two claims, not three", checkConsumableCapacity},
		{"prioritized list: the first available subrequest wins", checkPrioritizedList},
		{"admin access: allowed only in a labelled namespace", checkAdminAccess},
	}
	var failed []string
	for _, c := range checks {
		start := time.Now()
		err := c.run(ctx, s)
		if err != nil {
			opts.Logger.Printf("FAIL %s (%.1fs): %v", c.name, time.Since(start).Seconds(), err)
			failed = append(failed, c.name)
			continue
		}
		opts.Logger.Printf("PASS %s (%.1fs)", c.name, time.Since(start).Seconds())
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d smoke checks failed: %v", len(failed), len(checks), failed)
	}
	return nil
}

// reset deletes what an earlier smoke run left and creates the namespaces.
func (s *smoke) reset(ctx context.Context) error {
	for _, ns := range []string{smokeNamespace, smokeAdminNamespace} {
		if err := s.client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete namespace %s: %w", ns, err)
		}
	}
	res := s.client.ResourceV1()
	if err := res.ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.driver=" + smokeDriver}); err != nil {
		return fmt.Errorf("delete smoke ResourceSlices: %w", err)
	}
	if err := res.DeviceClasses().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "tessera.dev/smoke=true"}); err != nil {
		return fmt.Errorf("delete smoke DeviceClasses: %w", err)
	}
	for _, ns := range []string{smokeNamespace, smokeAdminNamespace} {
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := s.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			return fmt.Errorf("namespace %s from an earlier run was not deleted in time: %w", ns, err)
		}
	}
	labels := map[string]map[string]string{
		smokeNamespace:      nil,
		smokeAdminNamespace: {resourceapi.DRAAdminNamespaceLabelKey: "true"},
	}
	for ns, l := range labels {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: l}}
		if _, err := s.client.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	// Pods are rejected until the namespace's default service account exists.
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, smokeTimeout, true, func(ctx context.Context) (bool, error) {
		for ns := range labels {
			if _, err := s.client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
				return false, nil //nolint:nilerr // keep polling
			}
		}
		return true, nil
	})
}

// waitFor polls cond until it reports done, failing with its last complaint.
func waitFor(ctx context.Context, what string, cond func(ctx context.Context) (done bool, complaint string, err error)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, smokeTimeout, true, func(ctx context.Context) (bool, error) {
		done, complaint, err := cond(ctx)
		last = complaint
		return done, err
	})
	if errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err) {
		return fmt.Errorf("%s: not within %s: %s", what, smokeTimeout, last)
	}
	return err
}
