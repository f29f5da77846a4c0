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
	"sort"
)

// single is what Index takes from one single-platform archive: its manifest
// descriptor (with the platform) and every blob.
type single struct {
	manifest descriptor
	blobs    map[string][]byte
}

// readSingle reads an OCI layout archive that Build wrote (one manifest).
func readSingle(path string) (single, error) {
	f, err := os.Open(path)
	if err != nil {
		return single{}, err
	}
	defer f.Close()
	out := single{blobs: map[string][]byte{}}
	var index []byte
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return single{}, fmt.Errorf("%s: %w", path, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return single{}, fmt.Errorf("%s: %s: %w", path, hdr.Name, err)
		}
		switch {
		case hdr.Name == "index.json":
			index = data
		case len(hdr.Name) > len("blobs/sha256/") && hdr.Name[:len("blobs/sha256/")] == "blobs/sha256/":
			sum := sha256.Sum256(data)
			digest := hex.EncodeToString(sum[:])
			if digest != hdr.Name[len("blobs/sha256/"):] {
				return single{}, fmt.Errorf("%s: blob %s has digest %s", path, hdr.Name, digest)
			}
			out.blobs["sha256:"+digest] = data
		}
	}
	var parsed struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(index, &parsed); err != nil {
		return single{}, fmt.Errorf("%s: index.json: %w", path, err)
	}
	if len(parsed.Manifests) != 1 || parsed.Manifests[0].MediaType != mediaManifest || parsed.Manifests[0].Platform == nil {
		return single{}, fmt.Errorf("%s: expected one image manifest with a platform in index.json (an archive of `images build`)", path)
	}
	out.manifest = parsed.Manifests[0]
	if _, ok := out.blobs[out.manifest.Digest]; !ok {
		return single{}, fmt.Errorf("%s: the manifest blob %s is missing", path, out.manifest.Digest)
	}
	return out, nil
}

// Index writes one OCI layout archive holding the images of several
// single-platform archives (written by Build or BuildPlatform), as a
// multi-platform image named ref: index.json points at an image index that
// lists one manifest per platform, which is what `ctr images import
// --all-platforms` and registries read (a runtime pulls its own platform).
// Blobs are kept once; the result depends only on the inputs.
func Index(out io.Writer, ref string, archives []string) error {
	if ref == "" {
		return errors.New("the image needs a reference (--ref)")
	}
	if len(archives) == 0 {
		return errors.New("an index needs at least one image archive")
	}
	blobs := map[string][]byte{}
	var manifests []descriptor
	seen := map[string]string{}
	for _, path := range archives {
		image, err := readSingle(path)
		if err != nil {
			return err
		}
		p := image.manifest.Platform
		key := p.OS + "/" + p.Architecture + "/" + p.Variant
		if other, dup := seen[key]; dup {
			return fmt.Errorf("%s and %s are both for %s", other, path, key)
		}
		seen[key] = path
		for digest, data := range image.blobs {
			blobs[digest] = data
		}
		manifest := image.manifest
		manifest.Annotations = nil
		manifests = append(manifests, manifest)
	}
	sort.Slice(manifests, func(i, j int) bool {
		a, b := manifests[i].Platform, manifests[j].Platform
		return a.Architecture+"/"+a.Variant < b.Architecture+"/"+b.Variant
	})
	nestedJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     manifests,
	})
	if err != nil {
		return err
	}
	nested := blobDescriptor(mediaIndex, nestedJSON)
	blobs[nested.Digest] = nestedJSON
	nested.Annotations = map[string]string{RefNameAnnotation: ref}
	indexJSON, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests":     []descriptor{nested},
	})
	if err != nil {
		return err
	}

	tw, err := startLayout(out, indexJSON)
	if err != nil {
		return err
	}
	digests := make([]string, 0, len(blobs))
	for digest := range blobs {
		digests = append(digests, digest)
	}
	sort.Strings(digests)
	for _, digest := range digests {
		if err := putFile(tw, blobPath(digest), blobs[digest]); err != nil {
			return err
		}
	}
	return tw.Close()
}
