// Package ociimage writes single-layer container images as OCI image layout
// archives (what `ctr images import` reads), from files on this machine.
//
// Hand-written rather than umoci (Debian's OCI image tool) because the local
// cluster needs very little: one uncompressed layer of a few files, no base
// image to unpack, no registry. The archive is a pure function of its inputs
// (sorted entries, owner root, modification time 0), so a rebuild from the same
// files gives the same digests, which lets callers cache archives by input hash;
// umoci would need an unpacked rootfs directory, root-owned files and an extra
// apt package for the same result.
package ociimage

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Kind of a layer entry.
type Kind int

const (
	File Kind = iota
	Dir
	Symlink
)

// Entry is one path of the image's filesystem.
type Entry struct {
	Kind Kind
	// Path inside the image, absolute ("/usr/local/bin/x").
	Path string
	// Mode bits (permissions only).
	Mode int64
	// Source is the file on this machine whose content a File gets; Content
	// is used when Source is empty.
	Source  string
	Content []byte
	// Target of a Symlink.
	Target string
}

// Config is the part of the image configuration a container starts from.
type Config struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
	User       string   `json:"User,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

// Media types of the OCI image specification.
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	// RefNameAnnotation names an image in index.json; ctr names the imported
	// image after it, so it carries the full reference.
	RefNameAnnotation = "org.opencontainers.image.ref.name"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// Platform names the machine an image's binaries are for, as OCI descriptors
// and image configs spell it: Architecture "amd64" or "arm64" (Go's GOARCH
// names), OS "linux", Variant "v8" for arm64.
type Platform struct {
	Architecture string
	OS           string
	Variant      string
}

// ParsePlatform reads "amd64" or "arm64" (or "linux/arm64/v8"); arm64 gets the
// variant v8, as registries and containerd expect.
func ParsePlatform(text string) (Platform, error) {
	parts := strings.Split(strings.TrimPrefix(text, "linux/"), "/")
	p := Platform{Architecture: parts[0], OS: "linux"}
	switch {
	case len(parts) == 1 && p.Architecture == "arm64":
		p.Variant = "v8"
	case len(parts) == 2:
		p.Variant = parts[1]
	case len(parts) > 2:
		return Platform{}, fmt.Errorf("platform %q is not ARCH or linux/ARCH[/VARIANT]", text)
	}
	if p.Architecture == "" {
		return Platform{}, fmt.Errorf("platform %q has no architecture", text)
	}
	return p, nil
}

// normalize checks the entries, adds missing parent directories and sorts
// them so parents come first and the layer is reproducible.
func normalize(entries []Entry) ([]Entry, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == "/" {
			return nil, fmt.Errorf("image path %q must be absolute and clean, and not /", e.Path)
		}
		if prev, dup := byPath[e.Path]; dup && !(prev.Kind == Dir && e.Kind == Dir) {
			return nil, fmt.Errorf("image path %s is given twice", e.Path)
		}
		if e.Kind == Symlink && e.Target == "" {
			return nil, fmt.Errorf("symlink %s has no target", e.Path)
		}
		byPath[e.Path] = e
	}
	for p := range byPath {
		for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
			if existing, ok := byPath[dir]; ok {
				if existing.Kind != Dir {
					return nil, fmt.Errorf("%s is inside %s, which is not a directory", p, dir)
				}
				continue
			}
			byPath[dir] = Entry{Kind: Dir, Path: dir, Mode: 0o755}
		}
	}
	out := make([]Entry, 0, len(byPath))
	for _, e := range byPath {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// writeLayer writes the layer tar to w.
func writeLayer(w io.Writer, entries []Entry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		name := strings.TrimPrefix(e.Path, "/")
		hdr := &tar.Header{Name: name, Mode: e.Mode, ModTime: epoch, Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		switch e.Kind {
		case Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case Symlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Target
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case File:
			hdr.Typeflag = tar.TypeReg
			if err := writeFile(tw, hdr, e); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func writeFile(tw *tar.Writer, hdr *tar.Header, e Entry) error {
	if e.Source == "" {
		hdr.Size = int64(len(e.Content))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.Content)
		return err
	}
	f, err := os.Open(e.Source)
	if err != nil {
		return fmt.Errorf("image file %s: %w", e.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("image file %s: %w", e.Path, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("image file %s: source %s is not a regular file", e.Path, e.Source)
	}
	hdr.Size = fi.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("image file %s: copy %s: %w", e.Path, e.Source, err)
	}
	return nil
}

// hashingFile writes to a file while hashing what it wrote.
type hashingFile struct {
	f    *os.File
	hash io.Writer
	n    int64
}

func (h *hashingFile) Write(p []byte) (int, error) {
	n, err := h.f.Write(p)
	h.hash.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// Build writes the OCI layout archive of an image named ref (a full reference,
// e.g. "docker.io/library/busybox:1.37") with entries as its one layer to out.
// tmpDir holds the layer while it is hashed.
func Build(out io.Writer, ref string, entries []Entry, cfg Config, tmpDir string) error {
	return BuildPlatform(out, ref, Platform{Architecture: runtime.GOARCH, OS: "linux"}, entries, cfg, tmpDir)
}

// BuildPlatform is Build for another platform's files (a cross-compiled
// binary): the config and the index say which.
func BuildPlatform(out io.Writer, ref string, target Platform, entries []Entry, cfg Config, tmpDir string) error {
	if ref == "" {
		return errors.New("the image needs a reference (--ref)")
	}
	entries, err := normalize(entries)
	if err != nil {
		return err
	}
	layerFile, err := os.CreateTemp(tmpDir, ".layer-*.tar")
	if err != nil {
		return fmt.Errorf("create a temporary layer file: %w", err)
	}
	defer os.Remove(layerFile.Name())
	defer layerFile.Close()
	h := sha256.New()
	hf := &hashingFile{f: layerFile, hash: h}
	if err := writeLayer(hf, entries); err != nil {
		return fmt.Errorf("write the layer of %s: %w", ref, err)
	}
	layer := descriptor{MediaType: mediaLayer, Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: hf.n}

	plat := platform{Architecture: target.Architecture, OS: target.OS, Variant: target.Variant}
	if plat.OS == "" {
		plat.OS = "linux"
	}
	imageConfig := map[string]any{
		"architecture": plat.Architecture,
		"os":           plat.OS,
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layer.Digest}},
		"history":      []map[string]string{{"created_by": "tests/cluster (tessera-cluster images build)"}},
	}
	if plat.Variant != "" {
		imageConfig["variant"] = plat.Variant
	}
	configJSON, err := json.Marshal(imageConfig)
	if err != nil {
		return err
	}
	configDesc := blobDescriptor(mediaConfig, configJSON)
	manifestJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaManifest,
		"config":        configDesc,
		"layers":        []descriptor{layer},
	})
	if err != nil {
		return err
	}
	manifestDesc := blobDescriptor(mediaManifest, manifestJSON)
	manifestDesc.Annotations = map[string]string{RefNameAnnotation: ref}
	manifestDesc.Platform = &plat
	indexJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}

	tw, err := startLayout(out, indexJSON)
	if err != nil {
		return err
	}
	for _, blob := range [][]byte{manifestJSON, configJSON} {
		if err := putFile(tw, blobPath(blobDescriptor("", blob).Digest), blob); err != nil {
			return err
		}
	}
	if _, err := layerFile.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: blobPath(layer.Digest), Mode: 0o644, Size: layer.Size, ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, layerFile); err != nil {
		return fmt.Errorf("copy the layer of %s: %w", ref, err)
	}
	return tw.Close()
}

// epoch is every archive entry's modification time, so that builds are reproducible.
var epoch = time.Unix(0, 0).UTC()

// startLayout starts an OCI image layout as a tar stream on out: the blob
// directories, the oci-layout file and index.json. The caller adds the blobs
// and closes the writer.
func startLayout(out io.Writer, indexJSON []byte) (*tar.Writer, error) {
	tw := tar.NewWriter(out)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}); err != nil {
			return nil, err
		}
	}
	if err := putFile(tw, "oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := putFile(tw, "index.json", indexJSON); err != nil {
		return nil, err
	}
	return tw, nil
}

// putFile adds a regular file with data to a layout.
func putFile(tw *tar.Writer, name string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

func blobDescriptor(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

func blobPath(digest string) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest, "sha256:")
}

// InputKey hashes everything an image is built from (the reference, the
// config, every entry and the content of every source file), so an archive
// built from the same key need not be built again.
func InputKey(ref string, entries []Entry, cfg Config) (string, error) {
	h := sha256.New()
	meta, err := json.Marshal(struct {
		Ref     string
		Config  Config
		Entries []Entry
		Version int
	}{ref, cfg, entries, 1})
	if err != nil {
		return "", err
	}
	h.Write(meta)
	for _, e := range entries {
		if e.Kind != File || e.Source == "" {
			continue
		}
		f, err := os.Open(e.Source)
		if err != nil {
			return "", fmt.Errorf("image file %s: %w", e.Path, err)
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("image file %s: read %s: %w", e.Path, e.Source, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
