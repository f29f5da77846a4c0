package fakecri

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RecordFormatVersion is bumped whenever ContainerRecord changes incompatibly.
const RecordFormatVersion = 1

// ContainerRecord is what the fake runtime writes for every CreateContainer
// call, one JSON file per container (see RecordFileName). It captures what the
// kubelet handed to the runtime, in particular the CDI device ids that came
// from a DRA driver's NodePrepareResources answer.
type ContainerRecord struct {
	FormatVersion int    `json:"formatVersion"`
	Node          string `json:"node"`
	Namespace     string `json:"namespace"`
	Pod           string `json:"pod"`
	PodUID        string `json:"podUID"`
	Container     string `json:"container"`
	Attempt       uint32 `json:"attempt"`
	SandboxID     string `json:"sandboxID"`
	ContainerID   string `json:"containerID"`
	Image         string `json:"image"`
	// CDIDevices are the fully qualified CDI device names from
	// ContainerConfig.CDIDevices, in the order the kubelet sent them.
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
	Env         []EnvVar          `json:"env"`
	Mounts      []Mount           `json:"mounts"`
	Devices     []Device          `json:"devices"`
	CreatedAt   time.Time         `json:"createdAt"`
}

// EnvVar is one environment variable of the container, in kubelet order.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Mount is one bind mount the kubelet asked for.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

// Device is one host device the kubelet asked to expose.
type Device struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

// RecordFileName is the file a container's record is written to inside the
// record directory. Kubernetes object names cannot contain '_', so the name is
// unambiguous. A restarted container overwrites its previous record; Attempt
// tells which creation the file describes.
func RecordFileName(namespace, pod, container string) string {
	return fmt.Sprintf("%s_%s_%s.json", namespace, pod, container)
}

// NewContainerRecord extracts the record of one CreateContainer request.
func NewContainerRecord(node, containerID string, req *runtimeapi.CreateContainerRequest, now time.Time) ContainerRecord {
	cfg := req.GetConfig()
	podMeta := req.GetSandboxConfig().GetMetadata()
	rec := ContainerRecord{
		FormatVersion: RecordFormatVersion,
		Node:          node,
		Namespace:     podMeta.GetNamespace(),
		Pod:           podMeta.GetName(),
		PodUID:        podMeta.GetUid(),
		Container:     cfg.GetMetadata().GetName(),
		Attempt:       cfg.GetMetadata().GetAttempt(),
		SandboxID:     req.GetPodSandboxId(),
		ContainerID:   containerID,
		Image:         cfg.GetImage().GetImage(),
		CDIDevices:    []string{},
		Annotations:   map[string]string{},
		Env:           []EnvVar{},
		Mounts:        []Mount{},
		Devices:       []Device{},
		CreatedAt:     now.UTC(),
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for k, v := range cfg.GetAnnotations() {
		rec.Annotations[k] = v
	}
	for _, e := range cfg.GetEnvs() {
		rec.Env = append(rec.Env, EnvVar{Name: e.GetKey(), Value: string(e.GetValue())})
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadonly()})
	}
	sort.Slice(rec.Mounts, func(i, j int) bool { return rec.Mounts[i].ContainerPath < rec.Mounts[j].ContainerPath })
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, Device{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions()})
	}
	return rec
}

// WriteRecord writes rec into dir atomically (temporary file, then rename), so
// a reader never sees a half-written record.
func WriteRecord(dir string, rec ContainerRecord) (string, error) {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encode record of container %s/%s/%s: %w", rec.Namespace, rec.Pod, rec.Container, err)
	}
	final := filepath.Join(dir, RecordFileName(rec.Namespace, rec.Pod, rec.Container))
	tmp, err := os.CreateTemp(dir, ".record-*.tmp")
	if err != nil {
		return "", fmt.Errorf("create temporary record file in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write record %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("close record %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", fmt.Errorf("move record into place at %s: %w", final, err)
	}
	return final, nil
}
