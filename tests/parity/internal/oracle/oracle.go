// Package oracle allocates ResourceClaims with the upstream structured allocator
// (k8s.io/dynamic-resource-allocation/structured v0.37.1) the way kube-scheduler's
// DynamicResources plugin v1.37.1 drives it, so that Tessera's first-fit mode can be
// compared with what the scheduler would do for the same objects.
//
// What "the way kube-scheduler drives it" means here (pkg/scheduler/framework/plugins/
// dynamicresources):
//   - the allocator features come from the scheduler's default feature gates
//     (AllocatorFeatures(NewSchedulerFeaturesFromGates(DefaultFeatureGate)));
//   - PreFilter: every request of every claim to allocate names a DeviceClass that exists
//     (missing: unschedulable; empty name: error), a request has exactly or firstAvailable;
//   - the allocated state is gathered from the claims in use as the scheduler's claim tracker
//     does (admin-access results are not in use; results with a share ID are shared
//     allocations with their consumed capacity);
//   - one Allocator per pod, Allocate once per node, each under the 10 s Filter timeout;
//     ErrFailedAllocationOnNode and a short result make the node unschedulable, the timeout
//     and every other error fail the scheduling attempt (an error on any node fails the pod:
//     with fewer than 100 nodes the scheduler filters every node).
//
// This is test tooling: nothing here is shipped.
package oracle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	resourcedefaults "k8s.io/kubernetes/pkg/apis/resource/v1"
	_ "k8s.io/kubernetes/pkg/features" // registers the Kubernetes feature gates and their 1.37 defaults
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// FilterTimeout is the DynamicResources plugin's default Filter timeout
// (DynamicResourcesArgs.filterTimeout, kube-scheduler config v1 defaults).
const FilterTimeout = 10 * time.Second

// DeviceRef names a device.
type DeviceRef struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

func (d DeviceRef) id() structured.DeviceID {
	return structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
}

// SharedRef is one shared allocation of a device.
type SharedRef struct {
	DeviceRef `json:",inline"`
	ShareID   string `json:"shareID"`
}

// ConsumedRef is capacity consumed on a device by shared allocations.
type ConsumedRef struct {
	DeviceRef `json:",inline"`
	Capacity  map[resourceapi.QualifiedName]resource.Quantity `json:"capacity"`
}

// ExplicitState is allocated state given directly (upstream's test cases do that) rather
// than through allocated claims.
type ExplicitState struct {
	Devices  []DeviceRef   `json:"devices,omitempty"`
	Shared   []SharedRef   `json:"shared,omitempty"`
	Consumed []ConsumedRef `json:"consumed,omitempty"`
}

// Instance is one allocation problem: the cluster's objects and the claims of one pod.
type Instance struct {
	Name            string                       `json:"name"`
	Nodes           []*v1.Node                   `json:"nodes,omitempty"`
	Slices          []*resourceapi.ResourceSlice `json:"slices,omitempty"`
	Classes         []*resourceapi.DeviceClass   `json:"classes,omitempty"`
	Claims          []*resourceapi.ResourceClaim `json:"claims"`
	AllocatedClaims []*resourceapi.ResourceClaim `json:"allocatedClaims,omitempty"`
	State           *ExplicitState               `json:"state,omitempty"`
	// Node, when set, restricts allocation to that node (replaying upstream's unit test cases,
	// which call Allocate for one node).
	Node string `json:"node,omitempty"`
	// FilterTimeoutMillis, when set, stops each Filter sooner than the scheduler's 10 s. The
	// generator sets it only on adversarial instances, which are built to need far more than
	// 10 s (a lower bound from their shape), so the verdict is the same timeout, sooner.
	FilterTimeoutMillis int64 `json:"filterTimeoutMillis,omitempty"`
}

// NodeOutcome is what Filter said about one node.
type NodeOutcome struct {
	Node        string                         `json:"node"`
	Outcome     string                         `json:"outcome"` // allocated | unsatisfiable | error
	ErrorClass  string                         `json:"errorClass,omitempty"`
	Message     string                         `json:"message,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	Micros      int64                          `json:"micros"`
}

// Outcome is what the scheduler would do with the pod.
type Outcome struct {
	Name        string                         `json:"name"`
	Outcome     string                         `json:"outcome"` // allocated | unsatisfiable | error
	Node        string                         `json:"node,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	ErrorClass  string                         `json:"errorClass,omitempty"`
	Message     string                         `json:"message,omitempty"`
	// Stage says where the verdict came from: prefilter or filter.
	Stage string        `json:"stage"`
	Nodes []NodeOutcome `json:"nodes,omitempty"`
}

// Features are the allocator features kube-scheduler v1.37.1 uses with its default gates.
func Features() structured.Features {
	return dynamicresources.AllocatorFeatures(feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate))
}

// NewCELCache is the scheduler's CEL cache for the default gates.
func NewCELCache() *cel.Cache {
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	return cel.NewCache(10, cel.Features{
		EnableConsumableCapacity: fts.EnableDRAConsumableCapacity,
		EnableListTypeAttributes: fts.EnableDRAListTypeAttributes,
	})
}

// ClassLister serves DeviceClasses like the scheduler's informer-backed lister.
type ClassLister []*resourceapi.DeviceClass

func (l ClassLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l ClassLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

// preFilter mirrors the checks DynamicResources.PreFilter makes on claims it must allocate.
// It returns nil when Filter may run.
func preFilter(inst *Instance, classes ClassLister) *Outcome {
	validate := func(class, request string) *Outcome {
		if class == "" {
			return &Outcome{Outcome: "error", ErrorClass: "invalid-request", Stage: "prefilter",
				Message: fmt.Sprintf("request %s: unsupported request type", request)}
		}
		if _, err := classes.Get(class); err != nil && apierrors.IsNotFound(err) {
			return &Outcome{Outcome: "unsatisfiable", ErrorClass: "missing-class", Stage: "prefilter",
				Message: fmt.Sprintf("request %s: device class %s does not exist", request, class)}
		}
		return nil
	}
	for _, claim := range inst.Claims {
		for _, request := range claim.Spec.Devices.Requests {
			switch {
			case request.Exactly != nil:
				if o := validate(request.Exactly.DeviceClassName, request.Name); o != nil {
					return o
				}
			case len(request.FirstAvailable) > 0:
				for _, sub := range request.FirstAvailable {
					if o := validate(sub.DeviceClassName, request.Name+"/"+sub.Name); o != nil {
						return o
					}
				}
			default:
				return &Outcome{Outcome: "unsatisfiable", ErrorClass: "unknown-request-type", Stage: "prefilter",
					Message: fmt.Sprintf("resource claim %s, request %s: unknown request type", claim.Name, request.Name)}
			}
		}
	}
	return nil
}

// AllocatedState gathers what the claims in use (and the explicit state) allocate, as the
// scheduler's claim tracker does with DRAConsumableCapacity on.
func AllocatedState(inst *Instance) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range inst.AllocatedClaims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, result := range claim.Status.Allocation.Devices.Results {
			if result.AdminAccess != nil && *result.AdminAccess {
				continue // not in use
			}
			id := structured.MakeDeviceID(result.Driver, result.Pool, result.Device)
			if result.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, result.ShareID))
				if result.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, result.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	if s := inst.State; s != nil {
		for _, d := range s.Devices {
			state.AllocatedDevices.Insert(d.id())
		}
		for _, d := range s.Shared {
			uid := types.UID(d.ShareID)
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(d.id(), &uid))
		}
		for _, d := range s.Consumed {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(d.id(), d.Capacity))
		}
	}
	return state
}

// Nodes are the instance's nodes sorted by name; without Node objects, one per nodeName used
// by a slice or device.
func Nodes(inst *Instance) []*v1.Node {
	nodes := append([]*v1.Node(nil), inst.Nodes...)
	if len(nodes) == 0 {
		names := sets.New[string]()
		for _, s := range inst.Slices {
			if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
				names.Insert(*s.Spec.NodeName)
			}
			for _, d := range s.Spec.Devices {
				if d.NodeName != nil && *d.NodeName != "" {
					names.Insert(*d.NodeName)
				}
			}
		}
		for _, n := range sets.List(names) {
			node := &v1.Node{}
			node.Name = n
			nodes = append(nodes, node)
		}
	}
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes
}

// Default applies the API server's defaults (allocationMode ExactCount, count 1, toleration
// operator Equal, taint timeAdded) to the instance's objects in place, as stored objects have them.
func Default(inst *Instance) {
	for _, c := range inst.Claims {
		resourcedefaults.SetObjectDefaults_ResourceClaim(c)
	}
	for _, c := range inst.AllocatedClaims {
		resourcedefaults.SetObjectDefaults_ResourceClaim(c)
	}
	for _, s := range inst.Slices {
		resourcedefaults.SetObjectDefaults_ResourceSlice(s)
	}
}

// Run decides the instance like kube-scheduler would (after applying the API defaults).
func Run(ctx context.Context, inst *Instance, features structured.Features, celCache *cel.Cache) Outcome {
	Default(inst)
	classes := ClassLister(inst.Classes)
	if o := preFilter(inst, classes); o != nil {
		o.Name = inst.Name
		return *o
	}
	allocator, err := structured.NewAllocator(ctx, features, AllocatedState(inst), classes, inst.Slices, celCache)
	if err != nil {
		return Outcome{Name: inst.Name, Outcome: "error", ErrorClass: "other", Stage: "prefilter", Message: err.Error()}
	}
	out := Outcome{Name: inst.Name, Outcome: "unsatisfiable", Stage: "filter"}
	var firstError *NodeOutcome
	for _, node := range Nodes(inst) {
		if inst.Node != "" && node.Name != inst.Node {
			continue
		}
		timeout := FilterTimeout
		if inst.FilterTimeoutMillis > 0 && time.Duration(inst.FilterTimeoutMillis)*time.Millisecond < timeout {
			timeout = time.Duration(inst.FilterTimeoutMillis) * time.Millisecond
		}
		n := Filter(ctx, allocator, node, inst.Claims, timeout)
		out.Nodes = append(out.Nodes, n)
		switch {
		case n.Outcome == "error" && firstError == nil:
			firstError = &out.Nodes[len(out.Nodes)-1]
		case n.Outcome == "allocated" && out.Outcome == "unsatisfiable":
			out.Outcome, out.Node, out.Allocations = "allocated", n.Node, n.Allocations
		}
	}
	if firstError != nil {
		out.Outcome, out.Node, out.Allocations = "error", firstError.Node, nil
		out.ErrorClass, out.Message = firstError.ErrorClass, firstError.Message
	}
	return out
}

// Filter is the allocation part of DynamicResources.Filter for one node, stopped after timeout
// (FilterTimeout in the scheduler).
func Filter(ctx context.Context, allocator structured.Allocator, node *v1.Node, claims []*resourceapi.ResourceClaim, timeout time.Duration) NodeOutcome {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	results, err := allocator.Allocate(ctx, node, claims)
	n := NodeOutcome{Node: node.Name, Micros: time.Since(start).Microseconds()}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		n.Outcome, n.ErrorClass = "error", "timeout"
		n.Message = fmt.Sprintf("node %s: timed out trying to allocate devices", node.Name)
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		n.Outcome, n.ErrorClass, n.Message = "unsatisfiable", "invalid-pools", err.Error()
	case err != nil:
		n.Outcome, n.ErrorClass, n.Message = "error", ClassifyError(err.Error()), err.Error()
	case len(results) != len(claims):
		n.Outcome = "unsatisfiable"
	default:
		n.Outcome, n.Allocations = "allocated", results
	}
	return n
}

// ClassifyError names the kind of an allocator error; Tessera's errors map to the same names.
func ClassifyError(msg string) string {
	contains := func(parts ...string) bool {
		for _, p := range parts {
			if strings.Contains(msg, p) {
				return true
			}
		}
		return false
	}
	switch {
	case contains("CEL runtime error"):
		return "cel-runtime"
	case contains("CEL compile error"):
		return "cel-compile"
	case contains("asks for all devices, but resource pool"):
		return "all-pool-unusable"
	case contains("because a claim constraint would not be satisfied"):
		return "all-constraint"
	case contains("exceeds the claim limit"):
		return "too-many-devices"
	case contains("checking capacity", "computing consumed capacity", "rechecking capacity"):
		return "capacity"
	case contains("NodeSelector", "node selection", "node selector"):
		return "node-selector"
	case contains("unsupported", "missing device class name", "CEL expression empty", "empty constraint",
		"exact count", "could not retrieve device class", "feature is disabled", "derived attributes"):
		return "invalid-request"
	}
	return "other"
}
