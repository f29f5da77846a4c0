package harness

import (
	"sort"
	"strings"
)

// FeatureGates are set identically on every component. In 1.37 the DRA core,
// admin access and prioritized lists are GA and locked on, device taints are
// GA, and partitionable devices, consumable capacity and binding conditions
// are beta and on by default. They are all named here anyway so a component
// that disagreed would fail loudly at start, and so the set is visible in one
// place. All of them are served by resource.k8s.io/v1, which is on by default.
// Alpha DRA features (list-type attributes, pool status, derived attributes,
// ...) would also need resource.k8s.io/v1alpha3.
//
// GenericWorkload (beta, off by default in 1.37) serves the Workload and
// PodGroup API (scheduling.k8s.io/v1beta1, named in RuntimeConfig: beta APIs
// are not served unless asked for), keeps pods' spec.schedulingGroup, and turns
// on kube-scheduler's GangScheduling plugin and the controller-manager's
// PodGroup protection: Tessera's gangs can be named by a PodGroup.
var FeatureGates = map[string]bool{
	"DynamicResourceAllocation":    true,
	"DRAAdminAccess":               true,
	"DRAPrioritizedList":           true,
	"DRADeviceTaints":              true,
	"DRADeviceTaintRules":          true,
	"DRAPartitionableDevices":      true,
	"DRAConsumableCapacity":        true,
	"DRADeviceBindingConditions":   true,
	"DRAResourceClaimDeviceStatus": true,
	"DRAExtendedResource":          true,
	"DRASchedulerFilterTimeout":    true,
	"GenericWorkload":              true,
}

// RuntimeConfig is the API server's --runtime-config: the API versions served
// beyond the defaults. TESSERA_RUNTIME_CONFIG is appended (a later entry for
// the same version wins).
const RuntimeConfig = "scheduling.k8s.io/v1beta1=true"

// RuntimeConfigFlag renders the --runtime-config value: RuntimeConfig, then
// extra ("group/version=true,..."), if any.
func RuntimeConfigFlag(extra string) string {
	extra = strings.Trim(strings.TrimSpace(extra), ",")
	if extra == "" {
		return RuntimeConfig
	}
	return RuntimeConfig + "," + extra
}

// FeatureGateFlag renders gates as the --feature-gates value, sorted.
func FeatureGateFlag(gates map[string]bool) string {
	parts := make([]string, 0, len(gates))
	for name, on := range gates {
		v := "false"
		if on {
			v = "true"
		}
		parts = append(parts, name+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// ParseFeatureGates parses "A=true,B=false" (the --feature-gates syntax) and
// overlays it on base, returning a new map.
func ParseFeatureGates(base map[string]bool, extra string) (map[string]bool, error) {
	out := make(map[string]bool, len(base))
	for k, v := range base {
		out[k] = v
	}
	for _, item := range strings.Split(extra, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, value, ok := strings.Cut(item, "=")
		if !ok || (value != "true" && value != "false") || name == "" {
			return nil, &gateSyntaxError{item: item}
		}
		out[name] = value == "true"
	}
	return out, nil
}

type gateSyntaxError struct{ item string }

func (e *gateSyntaxError) Error() string {
	return "feature gate " + `"` + e.item + `"` + " is not NAME=true or NAME=false"
}
