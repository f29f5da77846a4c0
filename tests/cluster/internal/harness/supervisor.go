package harness

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// running is a started component and the channel its exit arrives on.
type running struct {
	spec   Component
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // valid once exited is closed
}

// Supervisor runs the plan's components as its children, in stages, and stops
// them in reverse order on SIGTERM/SIGINT. It never restarts a component: a
// component that dies is reported in the status file (state "degraded") so a
// test sees the failure instead of a silently recovered cluster.
type Supervisor struct {
	layout  Layout
	plan    *Plan
	prober  *prober
	logger  *log.Logger
	running []*running
}

// Supervise is the `supervise` command; `up` starts it detached.
func Supervise(stateDir string) error {
	layout := Layout{StateDir: stateDir}
	logger := log.New(os.Stderr, "supervisor: ", log.LstdFlags|log.Lmicroseconds)
	plan, err := ReadPlan(layout.PlanFile())
	if err != nil {
		return err
	}
	if err := os.WriteFile(layout.SupervisorPIDFile(), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write supervisor pid file: %w", err)
	}
	defer os.Remove(layout.SupervisorPIDFile())
	s := &Supervisor{layout: layout, plan: plan, prober: &prober{pki: &PKI{Dir: layout.PKIDir()}}, logger: logger}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s.status(Status{State: StateStarting})
	if failure := s.start(ctx); failure != nil {
		s.logger.Printf("start-up failed: %s", failure.Message)
		s.stopAll()
		s.status(*failure)
		return errors.New(failure.Message)
	}
	s.status(Status{State: StateRunning})
	s.logger.Print("all components are up")
	s.watch(ctx)
	s.status(Status{State: StateStopping})
	s.stopAll()
	s.status(Status{State: StateStopped})
	return nil
}

func (s *Supervisor) status(st Status) {
	if err := writeStatus(s.layout.StatusFile(), st); err != nil {
		s.logger.Printf("cannot write status: %v", err)
	}
}

// stages returns the distinct stage numbers in ascending order.
func (s *Supervisor) stages() []int {
	seen := map[int]bool{}
	var out []int
	for _, c := range s.plan.Components {
		if !seen[c.Stage] {
			seen[c.Stage] = true
			out = append(out, c.Stage)
		}
	}
	sort.Ints(out)
	return out
}

// start launches every stage and waits for its probes; it returns the failure
// to report, or nil.
func (s *Supervisor) start(ctx context.Context) *Status {
	for _, stage := range s.stages() {
		var started []*running
		for _, spec := range s.plan.Components {
			if spec.Stage != stage {
				continue
			}
			r, err := s.launch(spec)
			if err != nil {
				return &Status{State: StateFailed, Component: spec.Name, LogFile: spec.LogFile, Message: err.Error()}
			}
			started = append(started, r)
		}
		for _, r := range started {
			if r.spec.OneShot {
				if failure := s.awaitExit(ctx, r); failure != nil {
					return failure
				}
				s.logger.Printf("%s finished", r.spec.Name)
				continue
			}
			if failure := s.awaitProbe(ctx, r); failure != nil {
				return failure
			}
			s.logger.Printf("%s is up", r.spec.Name)
		}
	}
	return nil
}

func (s *Supervisor) launch(spec Component) (*running, error) {
	logFile, err := os.OpenFile(spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", spec.LogFile, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd := exec.Command(spec.Args[0], spec.Args[1:]...)
	cmd.Dir = spec.WorkingDirPath
	cmd.Env = append(os.Environ(), spec.ExtraEnv...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Own process group: stopping a component signals everything it spawned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", spec.Name, spec.Args[0], err)
	}
	if err := os.WriteFile(spec.PIDFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		s.logger.Printf("cannot write pid file of %s: %v", spec.Name, err)
	}
	r := &running{spec: spec, cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.exited)
	}()
	s.running = append(s.running, r)
	s.logger.Printf("started %s (pid %d): %v", spec.Name, cmd.Process.Pid, spec.Args)
	return r, nil
}

func (s *Supervisor) awaitProbe(ctx context.Context, r *running) *Status {
	deadline := time.Now().Add(time.Duration(r.spec.StartTimeoutS) * time.Second)
	fail := func(msg string) *Status {
		return &Status{State: StateFailed, Component: r.spec.Name, LogFile: r.spec.LogFile, Message: msg}
	}
	var lastErr error
	for {
		select {
		case <-r.exited:
			return fail(fmt.Sprintf("%s exited during start-up (%v); see %s", r.spec.Name, r.err, r.spec.LogFile))
		case <-ctx.Done():
			return fail("start-up interrupted by a signal")
		default:
		}
		if lastErr = s.prober.check(ctx, r.spec.Probe); lastErr == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fail(fmt.Sprintf("%s did not become ready within %ds (last probe error: %v); see %s",
				r.spec.Name, r.spec.StartTimeoutS, lastErr, r.spec.LogFile))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// awaitExit waits for a one-shot component to finish with status 0.
func (s *Supervisor) awaitExit(ctx context.Context, r *running) *Status {
	fail := func(msg string) *Status {
		return &Status{State: StateFailed, Component: r.spec.Name, LogFile: r.spec.LogFile, Message: msg}
	}
	select {
	case <-r.exited:
		if r.err != nil {
			return fail(fmt.Sprintf("%s failed (%v); see %s", r.spec.Name, r.err, r.spec.LogFile))
		}
		os.Remove(r.spec.PIDFile)
		return nil
	case <-ctx.Done():
		return fail("start-up interrupted by a signal")
	case <-time.After(time.Duration(r.spec.StartTimeoutS) * time.Second):
		signalGroup(r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.exited
		return fail(fmt.Sprintf("%s did not finish within %ds; see %s", r.spec.Name, r.spec.StartTimeoutS, r.spec.LogFile))
	}
}

// watch blocks until a stop signal, reporting components that exit meanwhile.
func (s *Supervisor) watch(ctx context.Context) {
	exits := make(chan *running, len(s.running))
	for _, r := range s.running {
		if r.spec.OneShot {
			continue
		}
		go func(r *running) {
			select {
			case <-r.exited:
				exits <- r
			case <-ctx.Done():
			}
		}(r)
	}
	for {
		select {
		case <-ctx.Done():
			s.logger.Print("stop requested")
			return
		case r := <-exits:
			msg := fmt.Sprintf("%s exited unexpectedly (%v); see %s", r.spec.Name, r.err, r.spec.LogFile)
			s.logger.Print(msg)
			s.status(Status{State: StateDegraded, Component: r.spec.Name, LogFile: r.spec.LogFile, Message: msg})
		}
	}
}

// stopAll stops components stage by stage, newest stage first.
func (s *Supervisor) stopAll() {
	stages := s.stages()
	for i := len(stages) - 1; i >= 0; i-- {
		var stage []*running
		for _, r := range s.running {
			if r.spec.Stage == stages[i] && !r.spec.OneShot {
				stage = append(stage, r)
			}
		}
		for _, r := range stage {
			s.runStopHook(r)
		}
		for _, r := range stage {
			signalGroup(r.cmd.Process.Pid, syscall.SIGTERM)
		}
		for _, r := range stage {
			select {
			case <-r.exited:
			case <-time.After(time.Duration(r.spec.StopTimeoutS) * time.Second):
				s.logger.Printf("%s did not stop within %ds; killing it", r.spec.Name, r.spec.StopTimeoutS)
				signalGroup(r.cmd.Process.Pid, syscall.SIGKILL)
				<-r.exited
			}
			os.Remove(r.spec.PIDFile)
			s.logger.Printf("stopped %s", r.spec.Name)
		}
	}
}

// runStopHook runs a component's stop hook (at most a minute), logging into
// the component's log, unless the component is gone already.
func (s *Supervisor) runStopHook(r *running) {
	if len(r.spec.StopHook) == 0 {
		return
	}
	select {
	case <-r.exited:
		return
	default:
	}
	logFile, err := os.OpenFile(r.spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.logger.Printf("stop hook of %s: open log: %v", r.spec.Name, err)
		return
	}
	defer logFile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.spec.StopHook[0], r.spec.StopHook[1:]...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	start := time.Now()
	if err := cmd.Run(); err != nil {
		s.logger.Printf("stop hook of %s failed after %.1fs (%v); see %s", r.spec.Name, time.Since(start).Seconds(), err, r.spec.LogFile)
		return
	}
	s.logger.Printf("stop hook of %s done in %.1fs", r.spec.Name, time.Since(start).Seconds())
}

// signalGroup signals the process group led by pid (each component leads its own).
func signalGroup(pid int, sig syscall.Signal) {
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(pid, sig)
	}
}
