package oracle

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// CELDevice is a device as a selector sees it.
type CELDevice struct {
	Driver string             `json:"driver"`
	Device resourceapi.Device `json:"device"`
}

// CELVerdict is one selector's result on one device.
type CELVerdict struct {
	// Result: true | false | error (compile or runtime).
	Result     string `json:"result"`
	ErrorClass string `json:"errorClass,omitempty"`
	Message    string `json:"message,omitempty"`
}

// EvaluateCEL evaluates every expression on every device with the scheduler's CEL cache, the
// way the allocator's selectorsMatch does. The answer is indexed [expression][device].
func EvaluateCEL(ctx context.Context, cache *cel.Cache, expressions []string, devices []CELDevice) [][]CELVerdict {
	out := make([][]CELVerdict, len(expressions))
	for i, expr := range expressions {
		compiled := cache.GetOrCompile(expr)
		out[i] = make([]CELVerdict, len(devices))
		for j, d := range devices {
			if compiled.Error != nil {
				out[i][j] = CELVerdict{Result: "error", ErrorClass: "cel-compile", Message: compiled.Error.Error()}
				continue
			}
			matches, _, err := compiled.DeviceMatches(ctx, CELInput(d))
			switch {
			case err != nil:
				out[i][j] = CELVerdict{Result: "error", ErrorClass: "cel-runtime", Message: cel.EnhanceRuntimeError(err).Error()}
			case matches:
				out[i][j] = CELVerdict{Result: "true"}
			default:
				out[i][j] = CELVerdict{Result: "false"}
			}
		}
	}
	return out
}

// CELInput is the allocator's cel.Device for a device of a driver.
func CELInput(d CELDevice) cel.Device {
	return cel.Device{
		Driver:                   d.Driver,
		AllowMultipleAllocations: d.Device.AllowMultipleAllocations,
		Attributes:               d.Device.Attributes,
		Capacity:                 d.Device.Capacity,
	}
}
