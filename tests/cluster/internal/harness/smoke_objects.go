package harness

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// smokeLabels mark cluster-scoped smoke objects for clean-up.
var smokeLabels = map[string]string{"tessera.dev/smoke": "true"}

// kindClass is a DeviceClass selecting the smoke driver's devices whose
// "kind" attribute equals kind.
func kindClass(kind string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke-" + kind, Labels: smokeLabels},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == %q && device.attributes[%q].kind == %q`, smokeDriver, smokeDriver, kind),
		}}}},
	}
}

// device builds a device with a "kind" attribute plus extra string attributes.
func device(name, kind string, attrs ...string) resourceapi.Device {
	d := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"kind": {StringValue: ptr.To(kind)},
	}}
	for _, kv := range attrs {
		k, v, _ := strings.Cut(kv, "=")
		d.Attributes[resourceapi.QualifiedName(k)] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
	}
	return d
}

// nodeSlice is a ResourceSlice of the smoke driver on node. Each slice is its
// own pool unless sliceCount says the pool spans several slices.
func nodeSlice(name, node, pool string, sliceCount int64, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: smokeLabels},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   smokeDriver,
			Pool:     resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: sliceCount},
			NodeName: ptr.To(node),
			Devices:  devices,
		},
	}
}

// exactRequest asks for count devices of a class, optionally filtered by CEL.
func exactRequest(name, class string, count int64, cel string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
	if cel != "" {
		r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	}
	return r
}

func claim(namespace, name string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
}

// podWithClaim is a one-container pod using the named ResourceClaim; with an
// empty claim it is a plain pod.
func podWithClaim(namespace, name, claimName string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if claimName != "" {
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimName: ptr.To(claimName)}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "devices"}}
	}
	return pod
}

func quantity(s string) resource.Quantity { return resource.MustParse(s) }

// create creates every object, stopping at the first error.
func (s *smoke) create(ctx context.Context, objs ...any) error {
	res := s.client.ResourceV1()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *resourceapi.DeviceClass:
			_, err = res.DeviceClasses().Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.ResourceSlice:
			_, err = res.ResourceSlices().Create(ctx, o, metav1.CreateOptions{})
		case *resourceapi.ResourceClaim:
			_, err = res.ResourceClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = s.client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			return fmt.Errorf("smoke: cannot create %T", obj)
		}
		if err != nil {
			return fmt.Errorf("create %T %s: %w", obj, objectName(obj), err)
		}
	}
	return nil
}

func objectName(obj any) string {
	if o, ok := obj.(metav1.Object); ok {
		if o.GetNamespace() != "" {
			return o.GetNamespace() + "/" + o.GetName()
		}
		return o.GetName()
	}
	return "?"
}
