package harness

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func checkPlainPod(ctx context.Context, s *smoke) error {
	if err := s.create(ctx, podWithClaim(smokeNamespace, "plain", "")); err != nil {
		return err
	}
	pod, err := s.waitPodRunning(ctx, smokeNamespace, "plain")
	if err != nil {
		return err
	}
	if s.runtime == RuntimeContainerd {
		return checkRealContainer(ctx, s, pod)
	}
	rec, err := s.readRecord(pod.Spec.NodeName, smokeNamespace, "plain", "main")
	if err != nil {
		return err
	}
	if rec.PodUID != string(pod.UID) || rec.Node != pod.Spec.NodeName || len(rec.CDIDevices) != 0 {
		return fmt.Errorf("container record %+v does not match pod uid %s on %s without CDI devices", rec, pod.UID, pod.Spec.NodeName)
	}
	return nil
}

// checkRealContainer: with containerd the pod's container really runs (a
// containerd container ID), its IP comes from its node's pod range, and the
// `kubernetes` service has the API server's bridge address as its endpoint,
// which is what pods reach it through.
func checkRealContainer(ctx context.Context, s *smoke, pod *corev1.Pod) error {
	statuses := pod.Status.ContainerStatuses
	if len(statuses) != 1 || !strings.HasPrefix(statuses[0].ContainerID, "containerd://") || statuses[0].State.Running == nil {
		return fmt.Errorf("want one running containerd container, got statuses %+v", statuses)
	}
	first, _ := PodRange(1)
	prefix := first[:strings.LastIndex(first, ".")+1]
	if !strings.HasPrefix(pod.Status.PodIP, prefix) {
		return fmt.Errorf("pod IP %q is not in %s's range %s*", pod.Status.PodIP, s.node, prefix)
	}
	slices, err := s.client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		return err
	}
	for _, slice := range slices.Items {
		for _, ep := range slice.Endpoints {
			for _, addr := range ep.Addresses {
				if addr == BridgeIP.String() {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("the kubernetes service has no endpoint %s: %+v", BridgeIP, slices.Items)
}

func checkAllocation(ctx context.Context, s *smoke) error {
	err := s.create(ctx,
		kindClass("plain"),
		nodeSlice("smoke-plain", s.node, "plain", 1, device("gpu-0", "plain", "model=h100"), device("gpu-1", "plain", "model=h100")),
		claim(smokeNamespace, "one-gpu", exactRequest("gpu", "smoke-plain", 1, `device.attributes["smoke.tessera.dev"].model == "h100"`)),
		podWithClaim(smokeNamespace, "one-gpu", "one-gpu"),
	)
	if err != nil {
		return err
	}
	c, err := s.waitAllocated(ctx, smokeNamespace, "one-gpu")
	if err != nil {
		return err
	}
	r, err := onlyResult(c)
	if err != nil {
		return err
	}
	if r.Request != "gpu" || r.Driver != smokeDriver || r.Pool != "plain" || (r.Device != "gpu-0" && r.Device != "gpu-1") {
		return fmt.Errorf("unexpected allocation result %+v", r)
	}
	if sel := c.Status.Allocation.NodeSelector; sel == nil || !strings.Contains(sel.String(), s.node) {
		return fmt.Errorf("allocation node selector %v does not name %s", sel, s.node)
	}
	return s.waitScheduledTo(ctx, smokeNamespace, "one-gpu", s.node)
}

func checkDeviceTaints(ctx context.Context, s *smoke) error {
	taint := resourceapi.DeviceTaint{Key: "smoke.tessera.dev/unhealthy", Value: "true", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	tainted := device("tainted-0", "tainted")
	tainted.Taints = []resourceapi.DeviceTaint{taint}
	if err := s.create(ctx, kindClass("tainted"), nodeSlice("smoke-tainted", s.node, "tainted", 1, tainted)); err != nil {
		return err
	}
	back, err := s.client.ResourceV1().ResourceSlices().Get(ctx, "smoke-tainted", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if got := back.Spec.Devices[0].Taints; len(got) != 1 || got[0].Key != taint.Key || got[0].Effect != taint.Effect {
		return fmt.Errorf("the API server dropped or changed the device taint (DRADeviceTaints off?): got %+v", got)
	}
	if err := s.create(ctx,
		claim(smokeNamespace, "intolerant", exactRequest("gpu", "smoke-tainted", 1, "")),
		podWithClaim(smokeNamespace, "intolerant", "intolerant"),
	); err != nil {
		return err
	}
	if _, err := s.waitUnschedulable(ctx, smokeNamespace, "intolerant"); err != nil {
		return err
	}
	tolerating := exactRequest("gpu", "smoke-tainted", 1, "")
	tolerating.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: taint.Key, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if err := s.create(ctx, claim(smokeNamespace, "tolerant", tolerating), podWithClaim(smokeNamespace, "tolerant", "tolerant")); err != nil {
		return err
	}
	c, err := s.waitAllocated(ctx, smokeNamespace, "tolerant")
	if err != nil {
		return err
	}
	r, err := onlyResult(c)
	if err != nil {
		return err
	}
	if r.Device != "tainted-0" || len(r.Tolerations) != 1 {
		return fmt.Errorf("want tainted-0 allocated with the toleration recorded, got %+v", r)
	}
	return nil
}
