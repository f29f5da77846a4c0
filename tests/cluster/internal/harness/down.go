package harness

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DownOptions configure `down`.
type DownOptions struct {
	StateDir string
	// Purge removes the whole state dir; otherwise logs/ and the nodes' CDI
	// records are kept for inspection after a failed run.
	Purge  bool
	Logger *log.Logger
}

// Down stops the cluster in the state dir and removes what it left: processes,
// mounts under the kubelet roots, sockets, etcd data, credentials. Running it
// on a stopped or absent cluster is fine.
func Down(opts DownOptions) error {
	stateDir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return fmt.Errorf("resolve state dir %q: %w", opts.StateDir, err)
	}
	layout := Layout{StateDir: stateDir}
	if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
		opts.Logger.Printf("no cluster state in %s; nothing to do", stateDir)
		return nil
	}
	if _, err := os.Stat(filepath.Join(stateDir, markerFile)); err != nil {
		return fmt.Errorf("%s was not created by tests/cluster/up (no %s marker); refusing to touch it", stateDir, markerFile)
	}
	// A containerd cluster's plan says so; a bridge recorded as this state
	// dir's also means containerd ran here (say, the plan was removed by hand).
	plan, _ := ReadPlan(layout.PlanFile())
	owner, bridge := bridgeOwner()
	containerd := (plan != nil && plan.Runtime == RuntimeContainerd) || (bridge && owner == stateDir)
	if err := stopSupervisor(layout, opts.Logger); err != nil {
		return err
	}
	killLeftovers(layout, opts.Logger)
	if containerd {
		nodeDirs, _ := filepath.Glob(filepath.Join(stateDir, "c[0-9]*"))
		killContainerProcesses(layout, len(nodeDirs), opts.Logger)
	}
	if err := unmountUnder(stateDir, opts.Logger); err != nil {
		return err
	}
	if containerd {
		removeContainerCgroups(opts.Logger)
		if err := tearDownHostNetwork(stateDir, opts.Logger); err != nil {
			return err
		}
	}
	if left := Leftovers(layout, containerd); len(left) > 0 {
		return fmt.Errorf("the cluster in %s left these behind after down: %s", stateDir, strings.Join(left, "; "))
	}
	if opts.Purge {
		if err := os.RemoveAll(stateDir); err != nil {
			return fmt.Errorf("remove %s: %w", stateDir, err)
		}
		return nil
	}
	return removeRuntimeState(layout)
}

// stopSupervisor asks the supervisor to stop the components and waits for it.
func stopSupervisor(layout Layout, logger *log.Logger) error {
	pid, alive := supervisorPID(layout)
	if !alive {
		return nil
	}
	logger.Printf("stopping the cluster (supervisor pid %d)", pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal supervisor %d: %w", pid, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			logger.Printf("supervisor %d did not stop in time; killing it", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// killLeftovers kills components whose pid files survived (the supervisor was
// killed), but only processes whose command line names this state dir, so a
// recycled pid is never hit.
func killLeftovers(layout Layout, logger *log.Logger) {
	entries, _ := os.ReadDir(layout.PIDDir())
	for _, e := range entries {
		path := filepath.Join(layout.PIDDir(), e.Name())
		pid, err := readPID(path)
		if err == nil && processAlive(pid) && cmdlineMentions(pid, layout.StateDir) {
			logger.Printf("killing leftover %s (pid %d)", strings.TrimSuffix(e.Name(), ".pid"), pid)
			signalGroup(pid, syscall.SIGKILL)
			for i := 0; i < 50 && processAlive(pid); i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
		os.Remove(path)
	}
}

// unmountUnder lazily unmounts every mount point below dir, deepest first
// (the kubelet mounts tmpfs for secret and projected volumes).
func unmountUnder(dir string, logger *log.Logger) error {
	points := mountsUnder(dir)
	var failed []string
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			failed = append(failed, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		logger.Printf("unmounted %s", p)
	}
	if len(failed) > 0 {
		return fmt.Errorf("could not unmount: %s", strings.Join(failed, "; "))
	}
	return nil
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read the mount table: " + err.Error() + ")"}
	}
	defer f.Close()
	var points []string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) < 5 {
			continue
		}
		point := unescapeMountPath(fields[4])
		if strings.HasPrefix(point, dir+"/") {
			points = append(points, point)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points
}

// unescapeMountPath decodes the octal escapes (\040 for space...) of mountinfo.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeRuntimeState deletes everything but the logs, the CDI records and the
// marker, so the next `up` starts clean while a failed run stays inspectable.
func removeRuntimeState(layout Layout) error {
	entries, err := os.ReadDir(layout.StateDir)
	if err != nil {
		return fmt.Errorf("read %s: %w", layout.StateDir, err)
	}
	keep := map[string]bool{"logs": true, "nodes": true, markerFile: true, "status": true}
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(layout.StateDir, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", e.Name(), err)
		}
	}
	nodeDirs, _ := os.ReadDir(filepath.Join(layout.StateDir, "nodes"))
	for _, nd := range nodeDirs {
		dir := filepath.Join(layout.StateDir, "nodes", nd.Name())
		inner, _ := os.ReadDir(dir)
		for _, e := range inner {
			if e.Name() == "cdi-records" {
				continue
			}
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("remove %s: %w", filepath.Join(dir, e.Name()), err)
			}
		}
	}
	return nil
}

// supervisorPID returns the supervisor's pid and whether it is running.
func supervisorPID(layout Layout) (int, bool) {
	pid, err := readPID(layout.SupervisorPIDFile())
	if err != nil {
		return 0, false
	}
	return pid, processAlive(pid) && cmdlineMentions(pid, layout.StateDir)
}

func readPID(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func cmdlineMentions(pid int, text string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(data), text)
}
