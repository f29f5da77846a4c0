package harness

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
)

// checkPrioritizedList runs after checkAllocation took one of the two plain
// devices: the first subrequest (a model no device has) cannot be satisfied,
// the second takes the remaining device.
func checkPrioritizedList(ctx context.Context, s *smoke) error {
	req := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{
			Name: "b200", DeviceClassName: "smoke-plain", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["smoke.tessera.dev"].model == "b200"`}}},
		},
		{Name: "any", DeviceClassName: "smoke-plain", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}
	if err := s.create(ctx, claim(smokeNamespace, "prioritized", req), podWithClaim(smokeNamespace, "prioritized", "prioritized")); err != nil {
		return err
	}
	c, err := s.waitAllocated(ctx, smokeNamespace, "prioritized")
	if err != nil {
		return err
	}
	r, err := onlyResult(c)
	if err != nil {
		return err
	}
	if r.Request != "gpu/any" {
		return fmt.Errorf("want the result for subrequest gpu/any, got %+v", r)
	}
	return nil
}

// checkAdminAccess: the API server rejects an admin-access claim outside a
// namespace labelled resource.kubernetes.io/admin-access=true and accepts it
// inside one; the scheduler then allocates an already allocated device to it.
func checkAdminAccess(ctx context.Context, s *smoke) error {
	admin := func(namespace string) *resourceapi.ResourceClaim {
		req := exactRequest("gpu", "smoke-plain", 1, "")
		req.Exactly.AdminAccess = ptr.To(true)
		return claim(namespace, "admin", req)
	}
	err := s.create(ctx, admin(smokeNamespace))
	if err == nil {
		return fmt.Errorf("an admin-access claim was accepted in unlabelled namespace %s", smokeNamespace)
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		return fmt.Errorf("want the admin-access claim rejected as invalid or forbidden, got: %w", err)
	}
	if err := s.create(ctx, admin(smokeAdminNamespace), podWithClaim(smokeAdminNamespace, "admin", "admin")); err != nil {
		return err
	}
	c, err := s.waitAllocated(ctx, smokeAdminNamespace, "admin")
	if err != nil {
		return err
	}
	r, err := onlyResult(c)
	if err != nil {
		return err
	}
	if r.AdminAccess == nil || !*r.AdminAccess {
		return fmt.Errorf("want adminAccess=true in the allocation result, got %+v", r)
	}
	return nil
}
