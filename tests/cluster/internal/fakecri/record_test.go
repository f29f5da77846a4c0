package fakecri

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func sampleRequest() *runtimeapi.CreateContainerRequest {
	return &runtimeapi.CreateContainerRequest{
		PodSandboxId: "sandbox-1",
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: "ctr", Attempt: 2},
			Image:       &runtimeapi.ImageSpec{Image: "registry.k8s.io/pause:3.10"},
			CDIDevices:  []*runtimeapi.CDIDevice{{Name: "gpu.tessera.dev/gpu=gpu-0"}, {Name: "gpu.tessera.dev/gpu=gpu-1"}},
			Annotations: map[string]string{"a": "b"},
			Envs:        []*runtimeapi.KeyValue{{Key: "X", Value: []byte("1")}, {Key: "X", Value: []byte("2")}},
			Mounts: []*runtimeapi.Mount{
				{ContainerPath: "/z", HostPath: "/host/z", Readonly: true},
				{ContainerPath: "/a", HostPath: "/host/a"},
			},
			Devices: []*runtimeapi.Device{{ContainerPath: "/dev/x", HostPath: "/dev/y", Permissions: "rw"}},
		},
		SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod", Namespace: "ns", Uid: "uid-1"},
		},
	}
}

func TestNewContainerRecordCapturesWhatTheKubeletSent(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	got := NewContainerRecord("node-1", "ctr-id", sampleRequest(), now)
	want := ContainerRecord{
		FormatVersion: RecordFormatVersion,
		Node:          "node-1",
		Namespace:     "ns",
		Pod:           "pod",
		PodUID:        "uid-1",
		Container:     "ctr",
		Attempt:       2,
		SandboxID:     "sandbox-1",
		ContainerID:   "ctr-id",
		Image:         "registry.k8s.io/pause:3.10",
		CDIDevices:    []string{"gpu.tessera.dev/gpu=gpu-0", "gpu.tessera.dev/gpu=gpu-1"},
		Annotations:   map[string]string{"a": "b"},
		Env:           []EnvVar{{Name: "X", Value: "1"}, {Name: "X", Value: "2"}},
		Mounts:        []Mount{{ContainerPath: "/a", HostPath: "/host/a"}, {ContainerPath: "/z", HostPath: "/host/z", ReadOnly: true}},
		Devices:       []Device{{ContainerPath: "/dev/x", HostPath: "/dev/y", Permissions: "rw"}},
		CreatedAt:     now,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("record mismatch\n got: %+v\nwant: %+v", got, want)
	}
}

func TestEmptyRequestRecordsEmptyListsNotNull(t *testing.T) {
	rec := NewContainerRecord("n", "id", &runtimeapi.CreateContainerRequest{}, time.Unix(0, 0))
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"cdiDevices", "env", "mounts", "devices"} {
		if string(fields[key]) != "[]" {
			t.Errorf("%s = %s, want []", key, fields[key])
		}
	}
	if string(fields["annotations"]) != "{}" {
		t.Errorf("annotations = %s, want {}", fields["annotations"])
	}
}

func TestWriteRecordRoundTripsAndReplacesAnEarlierAttempt(t *testing.T) {
	dir := t.TempDir()
	first := NewContainerRecord("n", "id-0", sampleRequest(), time.Unix(1, 0))
	first.Attempt = 0
	if _, err := WriteRecord(dir, first); err != nil {
		t.Fatal(err)
	}
	second := NewContainerRecord("n", "id-1", sampleRequest(), time.Unix(2, 0))
	path, err := WriteRecord(dir, second)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "ns_pod_ctr.json"); path != want {
		t.Fatalf("path = %s, want %s", path, want)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want exactly the one record (no temporary files left)", len(entries))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back ContainerRecord
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, second) {
		t.Fatalf("read back %+v, want %+v", back, second)
	}
}

func decodeRecord(t *testing.T, data []byte) ContainerRecord {
	t.Helper()
	var rec ContainerRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("decode record: %v\n%s", err, data)
	}
	return rec
}
