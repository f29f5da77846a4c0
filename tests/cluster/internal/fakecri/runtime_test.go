package fakecri

import (
	"context"
	"io"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestServeRecordsCreateContainerOverGRPC drives the runtime the way the
// kubelet does: over a unix socket, sandbox first, then the container.
func TestServeRecordsCreateContainerOverGRPC(t *testing.T) {
	dir, err := os.MkdirTemp("", "fakecri") // t.TempDir() can exceed the unix socket path limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "cri.sock")
	recordDir := filepath.Join(dir, "records")
	if err := os.Mkdir(recordDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- NewRecordingRuntime("node-a", recordDir, dir, log.New(io.Discard, "", 0)).Serve(ctx, socket)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()

	status, err := client.Status(callCtx, &runtimeapi.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range status.GetStatus().GetConditions() {
		if !c.GetStatus() {
			t.Errorf("runtime condition %s is false, want the runtime ready", c.GetType())
		}
	}
	images := runtimeapi.NewImageServiceClient(conn)
	if _, err := images.PullImage(callCtx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "registry.k8s.io/pause:3.10"}}); err != nil {
		t.Fatal(err)
	}
	image, err := images.ImageStatus(callCtx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "registry.k8s.io/pause:3.10"}})
	if err != nil {
		t.Fatal(err)
	}
	if image.GetImage().GetSize() == 0 || image.GetImage().GetId() == "" {
		t.Errorf("pulled image reports id %q size %d; the kubelet rejects an image without both", image.GetImage().GetId(), image.GetImage().GetSize())
	}
	fsInfo, err := images.ImageFsInfo(callCtx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if fs := fsInfo.GetImageFilesystems(); len(fs) != 1 || fs[0].GetFsId().GetMountpoint() != dir {
		t.Errorf("image filesystems %v, want one at %s", fs, dir)
	}
	req := sampleRequest()
	sandbox, err := client.RunPodSandbox(callCtx, &runtimeapi.RunPodSandboxRequest{Config: req.SandboxConfig})
	if err != nil {
		t.Fatal(err)
	}
	req.PodSandboxId = sandbox.GetPodSandboxId()
	created, err := client.CreateContainer(callCtx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.StartContainer(callCtx, &runtimeapi.StartContainerRequest{ContainerId: created.GetContainerId()}); err != nil {
		t.Fatal(err)
	}
	ctrStatus, err := client.ContainerStatus(callCtx, &runtimeapi.ContainerStatusRequest{ContainerId: created.GetContainerId()})
	if err != nil {
		t.Fatal(err)
	}
	if got := ctrStatus.GetStatus().GetState(); got != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container state %s, want RUNNING", got)
	}

	data, err := os.ReadFile(filepath.Join(recordDir, RecordFileName("ns", "pod", "ctr")))
	if err != nil {
		t.Fatalf("no record written: %v", err)
	}
	rec := decodeRecord(t, data)
	if rec.ContainerID != created.GetContainerId() || rec.SandboxID != sandbox.GetPodSandboxId() || rec.Node != "node-a" {
		t.Errorf("record ids/node = %q %q %q, want %q %q node-a", rec.ContainerID, rec.SandboxID, rec.Node, created.GetContainerId(), sandbox.GetPodSandboxId())
	}
	if len(rec.CDIDevices) != 2 || rec.CDIDevices[1] != "gpu.tessera.dev/gpu=gpu-1" {
		t.Errorf("record CDI devices = %v", rec.CDIDevices)
	}
}
