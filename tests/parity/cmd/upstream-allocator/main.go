// Command upstream-allocator answers allocation questions with the upstream structured
// allocator driven as kube-scheduler v1.37.1 drives it (see internal/oracle). It reads one JSON
// request per line on stdin and writes one JSON answer per line on stdout, so that one process
// serves thousands of instances:
//
//	{"op":"allocate","instance":{...}}              -> oracle.Outcome
//	{"op":"cel","expressions":[...],"devices":[...]} -> {"verdicts":[[...]]}
//	{"op":"features"}                                -> the allocator features in use
//	{"op":"bench-load", ...}, {"op":"bench-run", ...} -> see bench.go
//
// Test tooling for tests/parity; never shipped.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"tessera.dev/tests/parity/internal/oracle"
)

type request struct {
	Op          string             `json:"op"`
	Instance    *oracle.Instance   `json:"instance,omitempty"`
	Expressions []string           `json:"expressions,omitempty"`
	Devices     []oracle.CELDevice `json:"devices,omitempty"`
	Bench       *benchRequest      `json:"bench,omitempty"`
}

func main() {
	ctx := context.Background()
	features := oracle.Features()
	celCache := oracle.NewCELCache()
	benches := map[string]*benchWorkload{}

	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	enc := json.NewEncoder(out)
	fail := func(format string, args ...any) {
		_ = enc.Encode(map[string]string{"error": fmt.Sprintf(format, args...)})
	}
	for {
		line, err := in.ReadBytes('\n')
		if len(line) == 0 && err != nil {
			break
		}
		var req request
		if jerr := json.Unmarshal(line, &req); jerr != nil {
			fail("decoding request: %v", jerr)
		} else {
			switch req.Op {
			case "allocate":
				if req.Instance == nil {
					fail("allocate: no instance")
					break
				}
				_ = enc.Encode(oracle.Run(ctx, req.Instance, features, celCache))
			case "cel":
				_ = enc.Encode(map[string]any{"verdicts": oracle.EvaluateCEL(ctx, celCache, req.Expressions, req.Devices)})
			case "features":
				_ = enc.Encode(features)
			case "bench-load", "bench-run", "bench-cel":
				answer, berr := bench(ctx, req, benches, features)
				if berr != nil {
					fail("%s: %v", req.Op, berr)
					break
				}
				_ = enc.Encode(answer)
			default:
				fail("unknown op %q", req.Op)
			}
		}
		if ferr := out.Flush(); ferr != nil {
			os.Exit(1)
		}
		if err != nil {
			break
		}
	}
}
