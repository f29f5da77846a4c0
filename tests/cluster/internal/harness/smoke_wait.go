package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"tessera.dev/tests/cluster/internal/fakecri"
)

// waitAllocated waits until the scheduler has allocated the claim.
func (s *smoke) waitAllocated(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	var got *resourceapi.ResourceClaim
	err := waitFor(ctx, "claim "+namespace+"/"+name+" allocated", func(ctx context.Context) (bool, string, error) {
		c, err := s.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		got = c
		if c.Status.Allocation == nil {
			return false, "status.allocation is unset" + s.podSchedulingHint(ctx, namespace), nil
		}
		return true, "", nil
	})
	return got, err
}

// podSchedulingHint reports why the namespace's pending pods are not scheduled.
func (s *smoke) podSchedulingHint(ctx context.Context, namespace string) string {
	pods, err := s.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var hints []string
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				hints = append(hints, fmt.Sprintf("pod %s: %s: %s", p.Name, c.Reason, c.Message))
			}
		}
	}
	if len(hints) == 0 {
		return ""
	}
	return " (" + strings.Join(hints, "; ") + ")"
}

// waitUnschedulable waits until the scheduler has tried the pod and reported
// it Unschedulable, and returns the scheduler's message.
func (s *smoke) waitUnschedulable(ctx context.Context, namespace, name string) (string, error) {
	var message string
	err := waitFor(ctx, "pod "+namespace+"/"+name+" reported Unschedulable", func(ctx context.Context) (bool, string, error) {
		p, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if p.Spec.NodeName != "" {
			return false, "", fmt.Errorf("pod was scheduled to %s, want it unschedulable", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				message = c.Message
				return true, "", nil
			}
		}
		return false, "no PodScheduled=False/Unschedulable condition yet", nil
	})
	return message, err
}

// waitPodRunning waits for the pod's phase to be Running.
func (s *smoke) waitPodRunning(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var got *corev1.Pod
	err := waitFor(ctx, "pod "+namespace+"/"+name+" Running", func(ctx context.Context) (bool, string, error) {
		p, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		got = p
		return p.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions), nil
	})
	return got, err
}

// waitScheduledTo waits until the pod is bound and checks the node.
func (s *smoke) waitScheduledTo(ctx context.Context, namespace, name, node string) error {
	return waitFor(ctx, "pod "+namespace+"/"+name+" bound to "+node, func(ctx context.Context) (bool, string, error) {
		p, err := s.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		if p.Spec.NodeName == "" {
			return false, "not bound yet", nil
		}
		if p.Spec.NodeName != node {
			return false, "", fmt.Errorf("bound to %s, want %s", p.Spec.NodeName, node)
		}
		return true, "", nil
	})
}

// readRecord loads the fake runtime's record of a container on a node.
func (s *smoke) readRecord(nodeName, namespace, pod, container string) (*fakecri.ContainerRecord, error) {
	var node Node
	found := false
	for i := 1; i <= MaxNodes; i++ {
		if NodeName(i) == nodeName {
			node, found = s.layout.Node(i), true
		}
	}
	if !found {
		return nil, fmt.Errorf("node %s is not a node of this cluster", nodeName)
	}
	path := filepath.Join(node.CDIRecordDir(), fakecri.RecordFileName(namespace, pod, container))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read container record: %w", err)
	}
	var rec fakecri.ContainerRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("decode container record %s: %w", path, err)
	}
	return &rec, nil
}

// onlyResult returns the claim's single allocation result.
func onlyResult(c *resourceapi.ResourceClaim) (resourceapi.DeviceRequestAllocationResult, error) {
	results := c.Status.Allocation.Devices.Results
	if len(results) != 1 {
		return resourceapi.DeviceRequestAllocationResult{}, fmt.Errorf("claim %s has %d allocation results, want 1: %+v", c.Name, len(results), results)
	}
	return results[0], nil
}
