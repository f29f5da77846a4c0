package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readArchive(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		files[hdr.Name] = body
	}
}

func build(t *testing.T, entries []Entry) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := Build(&out, "example.test/tools:1", entries, Config{Entrypoint: []string{"/bin/tool"}, User: "65532:65532"}, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestArchiveIsAValidOCILayoutNamedByItsReference(t *testing.T) {
	src := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries := []Entry{
		{Kind: File, Path: "/bin/tool", Mode: 0o755, Source: src},
		{Kind: Symlink, Path: "/usr/bin/tool", Target: "../../bin/tool"},
		{Kind: File, Path: "/etc/passwd", Mode: 0o644, Content: []byte("root:x:0:0::/root:/bin/sh\n")},
		{Kind: Dir, Path: "/tmp", Mode: 0o1777},
	}
	archive := build(t, entries)
	files := readArchive(t, archive)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var index struct {
		Manifests []descriptor
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s (%v)", files["index.json"], err)
	}
	m := index.Manifests[0]
	if m.Annotations[RefNameAnnotation] != "example.test/tools:1" || m.Platform == nil || m.Platform.OS != "linux" {
		t.Errorf("manifest descriptor %+v", m)
	}
	// Every blob is stored under its digest.
	for name, body := range files {
		if !strings.HasPrefix(name, "blobs/sha256/") || strings.HasSuffix(name, "/") {
			continue
		}
		sum := sha256.Sum256(body)
		if hex.EncodeToString(sum[:]) != strings.TrimPrefix(name, "blobs/sha256/") {
			t.Errorf("%s does not hold its digest's content", name)
		}
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(files[blobPath(m.Digest)], &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %s (%v)", files[blobPath(m.Digest)], err)
	}
	var config struct {
		Config Config
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files[blobPath(manifest.Config.Digest)], &config); err != nil {
		t.Fatal(err)
	}
	if config.Config.User != "65532:65532" || config.Config.Entrypoint[0] != "/bin/tool" || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest {
		t.Errorf("config %+v", config)
	}
	// The layer: parents first, owner root, mtime 0, the content and modes given.
	tr := tar.NewReader(bytes.NewReader(files[blobPath(manifest.Layers[0].Digest)]))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Uid != 0 || hdr.ModTime.Unix() != 0 {
			t.Errorf("%s: uid %d mtime %v", hdr.Name, hdr.Uid, hdr.ModTime)
		}
		switch hdr.Name {
		case "bin/tool":
			body, _ := io.ReadAll(tr)
			if string(body) != "#!/bin/sh\necho hi\n" || hdr.Mode != 0o755 {
				t.Errorf("bin/tool: mode %o body %q", hdr.Mode, body)
			}
		case "usr/bin/tool":
			if hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != "../../bin/tool" {
				t.Errorf("usr/bin/tool: %+v", hdr)
			}
		case "tmp/":
			if hdr.Mode != 0o1777 {
				t.Errorf("tmp mode %o", hdr.Mode)
			}
		}
	}
	want := []string{"bin/", "bin/tool", "etc/", "etc/passwd", "tmp/", "usr/", "usr/bin/", "usr/bin/tool"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("layer entries %v, want %v", names, want)
	}
	if again := build(t, entries); !bytes.Equal(again, archive) {
		t.Error("the same inputs must give the same archive")
	}
}

func TestBadEntriesAreRefused(t *testing.T) {
	cases := map[string][]Entry{
		"given twice":              {{Kind: File, Path: "/a"}, {Kind: File, Path: "/a"}},
		"absolute and clean":       {{Kind: File, Path: "a"}},
		"not a directory":          {{Kind: File, Path: "/a"}, {Kind: File, Path: "/a/b"}},
		"symlink /l has no target": {{Kind: Symlink, Path: "/l"}},
	}
	for want, entries := range cases {
		err := Build(io.Discard, "r:1", entries, Config{}, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error saying %q, got %v", want, err)
		}
	}
}

func TestInputKeyFollowsFileContent(t *testing.T) {
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("one"), 0o644)
	entries := []Entry{{Kind: File, Path: "/f", Mode: 0o644, Source: src}}
	k1, err := InputKey("r:1", entries, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if k2, _ := InputKey("r:1", entries, Config{}); k2 != k1 {
		t.Error("the key must be stable")
	}
	os.WriteFile(src, []byte("two"), 0o644)
	if k3, _ := InputKey("r:1", entries, Config{}); k3 == k1 {
		t.Error("changed file content must change the key")
	}
	if k4, _ := InputKey("r:2", entries, Config{}); k4 == k1 {
		t.Error("another reference must change the key")
	}
}
