// Smoke checks for devices shared between claims: partitions drawing on
// shared counters, and consumable capacity.

package harness

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func checkPartitionable(ctx context.Context, s *smoke) error {
	counters := nodeSlice("smoke-counters", s.node, "partitions", 2)
	counters.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-counters", Counters: map[string]resourceapi.Counter{"memory": {Value: quantity("40Gi")}}}}
	consume := func(d resourceapi.Device, amount string) resourceapi.Device {
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters", Counters: map[string]resourceapi.Counter{"memory": {Value: quantity(amount)}}}}
		return d
	}
	partitions := nodeSlice("smoke-partitions", s.node, "partitions", 2,
		consume(device("whole", "partition", "size=whole"), "40Gi"),
		consume(device("half-0", "partition", "size=half"), "20Gi"),
		consume(device("half-1", "partition", "size=half"), "20Gi"),
	)
	if err := s.create(ctx, kindClass("partition"), counters, partitions); err != nil {
		return err
	}
	if err := s.expectCountersKept(ctx); err != nil {
		return err
	}
	halves := exactRequest("halves", "smoke-partition", 2, `device.attributes["smoke.tessera.dev"].size == "half"`)
	if err := s.create(ctx, claim(smokeNamespace, "two-halves", halves), podWithClaim(smokeNamespace, "two-halves", "two-halves")); err != nil {
		return err
	}
	c, err := s.waitAllocated(ctx, smokeNamespace, "two-halves")
	if err != nil {
		return err
	}
	if got := c.Status.Allocation.Devices.Results; len(got) != 2 || got[0].Device == got[1].Device || !strings.HasPrefix(got[0].Device+got[1].Device, "half-") {
		return fmt.Errorf("want both halves allocated, got %+v", got)
	}
	whole := exactRequest("whole", "smoke-partition", 1, `device.attributes["smoke.tessera.dev"].size == "whole"`)
	if err := s.create(ctx, claim(smokeNamespace, "whole", whole), podWithClaim(smokeNamespace, "whole", "whole")); err != nil {
		return err
	}
	_, err = s.waitUnschedulable(ctx, smokeNamespace, "whole")
	return err
}

// expectCountersKept reads the partition slices back: an API server without
// DRAPartitionableDevices drops sharedCounters and consumesCounters.
func (s *smoke) expectCountersKept(ctx context.Context) error {
	counters, err := s.client.ResourceV1().ResourceSlices().Get(ctx, "smoke-counters", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(counters.Spec.SharedCounters) != 1 {
		return fmt.Errorf("sharedCounters not kept (DRAPartitionableDevices off?): %+v", counters.Spec)
	}
	partitions, err := s.client.ResourceV1().ResourceSlices().Get(ctx, "smoke-partitions", metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, d := range partitions.Spec.Devices {
		if len(d.ConsumesCounters) != 1 {
			return fmt.Errorf("consumesCounters of device %s not kept (DRAPartitionableDevices off?): %+v", d.Name, d)
		}
	}
	return nil
}

func checkConsumableCapacity(ctx context.Context, s *smoke) error {
	shared := device("shared-0", "shared")
	shared.AllowMultipleAllocations = ptr.To(true)
	shared.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {
		Value: quantity("10Gi"),
		RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    ptr.To(quantity("1Gi")),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(quantity("1Gi")), Step: ptr.To(quantity("1Gi"))},
		},
	}}
	if err := s.create(ctx, kindClass("shared"), nodeSlice("smoke-shared", s.node, "shared", 1, shared)); err != nil {
		return err
	}
	share := func(name string) error {
		req := exactRequest("mem", "smoke-shared", 1, "")
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": quantity("4Gi")}}
		return s.create(ctx, claim(smokeNamespace, name, req), podWithClaim(smokeNamespace, name, name))
	}
	shareIDs := map[string]bool{}
	for _, name := range []string{"share-a", "share-b"} {
		if err := share(name); err != nil {
			return err
		}
		c, err := s.waitAllocated(ctx, smokeNamespace, name)
		if err != nil {
			return err
		}
		r, err := onlyResult(c)
		if err != nil {
			return err
		}
		consumed := r.ConsumedCapacity["memory"]
		if r.Device != "shared-0" || r.ShareID == nil || consumed.Cmp(quantity("4Gi")) != 0 {
			return fmt.Errorf("claim %s: want shared-0 with a share ID and 4Gi consumed, got %+v", name, r)
		}
		shareIDs[string(*r.ShareID)] = true
	}
	if len(shareIDs) != 2 {
		return fmt.Errorf("the two shares got the same share ID: %v", shareIDs)
	}
	if err := share("share-c"); err != nil {
		return err
	}
	_, err := s.waitUnschedulable(ctx, smokeNamespace, "share-c")
	return err
}
