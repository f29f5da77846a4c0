package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"tessera.dev/tests/parity/internal/oracle"
)

// benchRequest drives the side-by-side benchmark (the Rust side interleaves its own runs):
//
//	bench-load: store a workload under ID: the cluster (Instance without claims), the claims
//	            in the order they arrive and the node each is allocated on, and a CEL cache of
//	            its own, kept from run to run as kube-scheduler keeps its cache;
//	bench-run:  allocate the workload's claims one after the other from an empty state, each
//	            on its node (NewAllocator with the state so far, then Allocate, as PreFilter and
//	            Filter do), and report the time of every Allocate call;
//	bench-cel:  evaluate each expression on the device Iterations times from the API object
//	            (the allocator's cel.Device of it, then DeviceMatches, on every call) and report
//	            nanoseconds per evaluation.
type benchRequest struct {
	ID          string            `json:"id"`
	Instance    *oracle.Instance  `json:"instance,omitempty"`
	Targets     []string          `json:"targets,omitempty"`
	Expressions []string          `json:"expressions,omitempty"`
	Device      *oracle.CELDevice `json:"device,omitempty"`
	Iterations  int               `json:"iterations,omitempty"`
}

type benchWorkload struct {
	instance *oracle.Instance
	nodes    map[string]*v1.Node
	targets  []string
	celCache *cel.Cache
}

type benchRun struct {
	// Nanos per claim, in claim order.
	Nanos     []int64 `json:"nanos"`
	Allocated int     `json:"allocated"`
	Failed    int     `json:"failed"`
	Errors    int     `json:"errors"`
	// FirstError is the first error's text, if any.
	FirstError string `json:"firstError,omitempty"`
}

func bench(ctx context.Context, req request, loaded map[string]*benchWorkload, features structured.Features) (any, error) {
	b := req.Bench
	if b == nil {
		return nil, errors.New("no bench field")
	}
	switch req.Op {
	case "bench-load":
		if b.Instance == nil || len(b.Targets) != len(b.Instance.Claims) {
			return nil, errors.New("need an instance and one target node per claim")
		}
		oracle.Default(b.Instance)
		w := &benchWorkload{instance: b.Instance, nodes: map[string]*v1.Node{}, targets: b.Targets, celCache: oracle.NewCELCache()}
		for _, n := range oracle.Nodes(b.Instance) {
			w.nodes[n.Name] = n
		}
		loaded[b.ID] = w
		return map[string]any{"loaded": b.ID, "claims": len(b.Targets)}, nil
	case "bench-run":
		w, ok := loaded[b.ID]
		if !ok {
			return nil, fmt.Errorf("workload %q not loaded", b.ID)
		}
		return runWorkload(ctx, w, features)
	case "bench-cel":
		if b.Device == nil || b.Iterations <= 0 {
			return nil, errors.New("need a device and iterations > 0")
		}
		return benchCEL(ctx, b)
	}
	return nil, fmt.Errorf("unknown op %s", req.Op)
}

func runWorkload(ctx context.Context, w *benchWorkload, features structured.Features) (*benchRun, error) {
	celCache := w.celCache
	classes := oracle.ClassLister(w.instance.Classes)
	state := oracle.AllocatedState(&oracle.Instance{State: w.instance.State, AllocatedClaims: w.instance.AllocatedClaims})
	run := &benchRun{Nanos: make([]int64, 0, len(w.targets))}
	for i, claim := range w.instance.Claims {
		node, ok := w.nodes[w.targets[i]]
		if !ok {
			return nil, fmt.Errorf("claim %d: node %q not in the workload", i, w.targets[i])
		}
		allocator, err := structured.NewAllocator(ctx, features, state, classes, w.instance.Slices, celCache)
		if err != nil {
			return nil, err
		}
		claims := []*resourceapi.ResourceClaim{claim}
		fctx, cancel := context.WithTimeout(ctx, oracle.FilterTimeout)
		start := time.Now()
		results, err := allocator.Allocate(fctx, node, claims)
		run.Nanos = append(run.Nanos, time.Since(start).Nanoseconds())
		cancel()
		switch {
		case err != nil:
			run.Errors++
			if run.FirstError == "" {
				run.FirstError = err.Error()
			}
		case len(results) != 1:
			run.Failed++
		default:
			run.Allocated++
			for _, r := range results[0].Devices.Results {
				if r.AdminAccess != nil && *r.AdminAccess {
					continue
				}
				state.AllocatedDevices.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
			}
		}
	}
	return run, nil
}

type celBench struct {
	// NanosPerEval per expression; -1 when the expression does not compile.
	NanosPerEval []float64 `json:"nanosPerEval"`
	Results      []string  `json:"results"`
}

func benchCEL(ctx context.Context, b *benchRequest) (*celBench, error) {
	cache := oracle.NewCELCache()
	out := &celBench{}
	for _, expr := range b.Expressions {
		compiled := cache.GetOrCompile(expr)
		if compiled.Error != nil {
			out.NanosPerEval = append(out.NanosPerEval, -1)
			out.Results = append(out.Results, "compile error: "+compiled.Error.Error())
			continue
		}
		var result string
		start := time.Now()
		for i := 0; i < b.Iterations; i++ {
			matches, _, err := compiled.DeviceMatches(ctx, oracle.CELInput(*b.Device))
			if i == 0 {
				result = fmt.Sprint(matches)
				if err != nil {
					result = "error: " + err.Error()
				}
			}
		}
		out.NanosPerEval = append(out.NanosPerEval, float64(time.Since(start).Nanoseconds())/float64(b.Iterations))
		out.Results = append(out.Results, result)
	}
	return out, nil
}
