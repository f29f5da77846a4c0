package ociimage

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// buildFor writes a tiny single-platform archive to a file and returns its path.
func buildFor(t *testing.T, dir, arch string) string {
	t.Helper()
	p, err := ParsePlatform(arch)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, arch+".tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries := []Entry{{Kind: File, Path: "/usr/local/bin/tool", Mode: 0o755, Content: []byte("a " + arch + " binary\n")}}
	if err := BuildPlatform(f, "example.test/tools:1", p, entries, Config{Entrypoint: []string{"/usr/local/bin/tool"}}, dir); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestIndexHoldsOneManifestPerPlatformUnderOneReference(t *testing.T) {
	dir := t.TempDir()
	archives := []string{buildFor(t, dir, "arm64"), buildFor(t, dir, "amd64")}
	var out bytes.Buffer
	if err := Index(&out, "example.test/tools:1", archives); err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, out.Bytes())
	// Every blob is named by its digest.
	for name, body := range files {
		if digest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && digest != "" {
			sum := sha256.Sum256(body)
			if hex.EncodeToString(sum[:]) != digest {
				t.Errorf("%s does not hash to its name", name)
			}
		}
	}
	blob := func(digest string) []byte {
		t.Helper()
		body, ok := files[blobPath(digest)]
		if !ok {
			t.Fatalf("blob %s is missing", digest)
		}
		return body
	}
	var top struct {
		Manifests []descriptor
	}
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaIndex ||
		top.Manifests[0].Annotations[RefNameAnnotation] != "example.test/tools:1" {
		t.Fatalf("index.json must name one image index by the reference: %s", files["index.json"])
	}
	var nested struct {
		MediaType string
		Manifests []descriptor
	}
	if err := json.Unmarshal(blob(top.Manifests[0].Digest), &nested); err != nil {
		t.Fatal(err)
	}
	if nested.MediaType != mediaIndex || len(nested.Manifests) != 2 {
		t.Fatalf("the image index lists %d manifests: %+v", len(nested.Manifests), nested)
	}
	want := []platform{{Architecture: "amd64", OS: "linux"}, {Architecture: "arm64", OS: "linux", Variant: "v8"}}
	for i, m := range nested.Manifests {
		if m.Platform == nil || *m.Platform != want[i] {
			t.Errorf("manifest %d is for %+v, want %+v", i, m.Platform, want[i])
		}
		var manifest struct {
			Config descriptor
			Layers []descriptor
		}
		if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil {
			t.Fatal(err)
		}
		var config struct {
			Architecture, OS, Variant string
		}
		if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
			t.Fatal(err)
		}
		if config.Architecture != want[i].Architecture || config.Variant != want[i].Variant {
			t.Errorf("manifest %d's config says %+v", i, config)
		}
		layer := readArchive(t, blob(manifest.Layers[0].Digest))
		if got := string(layer["usr/local/bin/tool"]); got != "a "+want[i].Architecture+" binary\n" {
			t.Errorf("the %s layer holds %q", want[i].Architecture, got)
		}
	}
	// The same inputs give the same bytes.
	var again bytes.Buffer
	if err := Index(&again, "example.test/tools:1", []string{archives[1], archives[0]}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), again.Bytes()) {
		t.Error("an index of the same archives differs from the first")
	}
}

func TestIndexRefusesTwoImagesOfOnePlatformAndForeignArchives(t *testing.T) {
	dir := t.TempDir()
	amd := buildFor(t, dir, "amd64")
	var out bytes.Buffer
	err := Index(&out, "example.test/tools:1", []string{amd, amd})
	if err == nil || !strings.Contains(err.Error(), "linux/amd64") {
		t.Errorf("two amd64 images: %v", err)
	}
	junk := filepath.Join(dir, "junk.tar")
	if err := os.WriteFile(junk, []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Index(&out, "example.test/tools:1", []string{junk}); err == nil {
		t.Error("a file that is no archive was accepted")
	}
	if _, err := ParsePlatform("linux/arm64/v8/x"); err == nil {
		t.Error("a platform with too many parts was accepted")
	}
}
