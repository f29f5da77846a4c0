// Package fakecri is the container runtime of the local test cluster: the
// upstream fake CRI server from k8s.io/cri-client/pkg/fake (the one kubemark's
// hollow nodes use), extended to record every CreateContainer request into a
// directory of JSON files that tests read to see which CDI devices reached a
// container. Pods reach Running; no process is ever started.
package fakecri

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// RecordingRuntime serves the CRI runtime service of the upstream fake and
// records each container creation before delegating to it.
type RecordingRuntime struct {
	*fake.RemoteRuntime
	node      string
	recordDir string
	logger    *log.Logger
}

// fakeImageSize is what every pulled image reports: the kubelet rejects an
// image whose size is unset (0) with ImageInspectError.
const fakeImageSize = 1 << 20

// NewRecordingRuntime returns a ready-reporting fake runtime for node that
// writes container records into recordDir and reports imageFsDir as its image
// and container filesystem (the kubelet's eviction manager and image GC need a
// real mount point to measure).
func NewRecordingRuntime(node, recordDir, imageFsDir string, logger *log.Logger) *RecordingRuntime {
	upstream := fake.NewFakeRemoteRuntime()
	upstream.ImageService.SetFakeImageSize(fakeImageSize)
	usage := []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: imageFsDir},
		UsedBytes:  &runtimeapi.UInt64Value{Value: fakeImageSize},
		InodesUsed: &runtimeapi.UInt64Value{Value: 1},
	}}
	upstream.ImageService.SetFakeFilesystemUsage(usage)
	upstream.ImageService.SetFakeContainerFilesystemUsage(usage)
	// Start() would set this; we serve ourselves so set it here.
	upstream.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	// Report the cgroup driver the kubelet is configured with, so the kubelet
	// does not fall back with a deprecation warning.
	upstream.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	return &RecordingRuntime{RemoteRuntime: upstream, node: node, recordDir: recordDir, logger: logger}
}

// CreateContainer records the request, then lets the upstream fake create the
// container. A record that cannot be written fails the call, so a test never
// silently misses what the kubelet sent.
func (r *RecordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	rec := NewContainerRecord(r.node, resp.GetContainerId(), req, time.Now())
	path, err := WriteRecord(r.recordDir, rec)
	if err != nil {
		return nil, fmt.Errorf("fake-cri: %w", err)
	}
	r.logger.Printf("CreateContainer %s/%s/%s attempt %d: cdiDevices=%v -> %s",
		rec.Namespace, rec.Pod, rec.Container, rec.Attempt, rec.CDIDevices, path)
	return resp, nil
}

// Serve registers the runtime and image services on a fresh gRPC server
// listening on the unix socket at socketPath, until ctx ends.
func (r *RecordingRuntime) Serve(ctx context.Context, socketPath string) error {
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", socketPath, err)
	}
	listener, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r.RemoteRuntime)
	go func() {
		<-ctx.Done()
		server.GracefulStop()
	}()
	r.logger.Printf("serving CRI for node %q on %s, records in %s", r.node, socketPath, r.recordDir)
	if err := server.Serve(listener); err != nil {
		return fmt.Errorf("serve CRI on %s: %w", socketPath, err)
	}
	return nil
}

// Main is the fake-cri command: fake-cri --socket PATH --record-dir DIR [--node NAME].
func Main(args []string) int {
	flags := flag.NewFlagSet("fake-cri", flag.ContinueOnError)
	socket := flags.String("socket", "", "unix socket path to serve CRI on (required)")
	recordDir := flags.String("record-dir", "", "directory to write one JSON record per created container into (required)")
	node := flags.String("node", "", "node name written into each record")
	imageFsDir := flags.String("image-fs-dir", "", "directory reported as the image filesystem (default: the record dir)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	logger := log.New(os.Stderr, "fake-cri: ", log.LstdFlags|log.Lmicroseconds)
	if *socket == "" || *recordDir == "" {
		logger.Print("--socket and --record-dir are required")
		return 2
	}
	if err := os.MkdirAll(*recordDir, 0o755); err != nil {
		logger.Printf("create record directory: %v", err)
		return 1
	}
	if err := os.MkdirAll(filepath.Dir(*socket), 0o755); err != nil {
		logger.Printf("create socket directory: %v", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *imageFsDir == "" {
		*imageFsDir = *recordDir
	}
	if err := NewRecordingRuntime(*node, *recordDir, *imageFsDir, logger).Serve(ctx, *socket); err != nil {
		logger.Print(err)
		return 1
	}
	_ = os.Remove(*socket)
	return 0
}
