package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Supervisor states, written to the status file.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateDegraded = "degraded" // running, but a component exited on its own
	StateFailed   = "failed"   // start-up failed; everything was stopped
	StateStopping = "stopping"
	StateStopped  = "stopped"
)

// Status is the supervisor's report, read by `up` while it waits.
type Status struct {
	State     string    `json:"state"`
	Message   string    `json:"message,omitempty"`
	Component string    `json:"component,omitempty"` // the component a failure is about
	LogFile   string    `json:"logFile,omitempty"`   // that component's log
	Time      time.Time `json:"time"`
}

func writeStatus(path string, s Status) error {
	s.Time = time.Now().UTC()
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write status %s: %w", tmp, err)
	}
	return os.Rename(tmp, path)
}

func readStatus(path string) (Status, error) {
	var s Status
	data, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("decode status %s: %w", path, err)
	}
	return s, nil
}
