package harness

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRICleanup stops and removes every pod sandbox of the CRI runtime at socket
// (containerd's stop hook, run after the kubelets stopped): containerd then
// kills the containers, deletes them with runc (which removes their cgroups),
// tears their network down through CNI (the veth, the IP lease, libcni's
// cached result) and lets each shim exit. What it cannot do is left to
// `down`'s safety net (processes by PID, mounts, the bridge).
func CRICleanup(ctx context.Context, socket string, logger *log.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 50*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the CRI at %s: %w", socket, err)
	}
	defer conn.Close()
	client := runtimeapi.NewRuntimeServiceClient(conn)
	list, err := client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pod sandboxes at %s: %w", socket, err)
	}
	var failed []string
	for _, sandbox := range list.GetItems() {
		name := sandbox.GetMetadata().GetNamespace() + "/" + sandbox.GetMetadata().GetName()
		if _, err := client.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.GetId()}); err != nil {
			failed = append(failed, fmt.Sprintf("stop %s: %v", name, err))
			continue
		}
		if _, err := client.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.GetId()}); err != nil {
			failed = append(failed, fmt.Sprintf("remove %s: %v", name, err))
			continue
		}
		logger.Printf("removed pod sandbox %s (%.12s)", name, sandbox.GetId())
	}
	if len(failed) > 0 {
		return fmt.Errorf("CRI cleanup at %s: %v", socket, failed)
	}
	logger.Printf("removed %d pod sandbox(es) at %s", len(list.GetItems()), socket)
	return nil
}
