package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"tessera.dev/tests/cluster/internal/harness"
	"tessera.dev/tests/cluster/internal/ociimage"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func images(ctx context.Context, args []string, logger *log.Logger) error {
	if len(args) == 0 {
		return errors.New("images: say build, index or import")
	}
	switch args[0] {
	case "build":
		return imagesBuild(args[1:], logger)
	case "import":
		return imagesImport(ctx, args[1:], logger)
	case "index":
		return imagesIndex(args[1:], logger)
	default:
		return fmt.Errorf("images %s: say build, index or import", args[0])
	}
}

// parseMode reads an optional octal mode ("0755"), defaulting to def.
func parseMode(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseInt(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q is not octal", s)
	}
	return m, nil
}

func imagesBuild(args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("images build", flag.ExitOnError)
	ref := fs.String("ref", "", "the image's full reference, e.g. docker.io/library/busybox:1.37")
	out := fs.String("out", "", "the OCI archive to write")
	user := fs.String("user", "", "user the container runs as (uid:gid)")
	workdir := fs.String("workdir", "", "working directory")
	platformText := fs.String("platform", "", "the platform the files are for: amd64 or arm64 (default: this machine's)")
	var files, contents, dirs, links, entrypoint, cmd, env stringList
	fs.Var(&files, "file", "SRC:DST[:MODE] a file of this machine (mode default: the source's)")
	fs.Var(&contents, "content", "DST:TEXT[:MODE] a file with this text (mode default 0644)")
	fs.Var(&dirs, "dir", "DST[:MODE] a directory (default 0755)")
	fs.Var(&links, "symlink", "DST:TARGET a symbolic link")
	fs.Var(&entrypoint, "entrypoint", "one argument of the entrypoint (repeatable)")
	fs.Var(&cmd, "cmd", "one argument of the default command (repeatable)")
	fs.Var(&env, "env", "K=V in the image's environment (repeatable)")
	_ = fs.Parse(args)
	if *ref == "" || *out == "" {
		return errors.New("images build needs --ref and --out")
	}
	var entries []ociimage.Entry
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--file %q is not SRC:DST[:MODE]", f)
		}
		fi, err := os.Stat(parts[0])
		if err != nil {
			return fmt.Errorf("--file %s: %w", f, err)
		}
		mode := int64(fi.Mode().Perm())
		if len(parts) == 3 {
			if mode, err = parseMode(parts[2], 0); err != nil {
				return fmt.Errorf("--file %s: %w", f, err)
			}
		}
		entries = append(entries, ociimage.Entry{Kind: ociimage.File, Path: parts[1], Source: parts[0], Mode: mode})
	}
	for _, c := range contents {
		dst, rest, ok := strings.Cut(c, ":")
		if !ok {
			return fmt.Errorf("--content %q is not DST:TEXT[:MODE]", c)
		}
		text, modeText := rest, ""
		if i := strings.LastIndex(rest, ":"); i >= 0 && len(rest)-i <= 5 {
			if _, err := strconv.ParseInt(rest[i+1:], 8, 32); err == nil {
				text, modeText = rest[:i], rest[i+1:]
			}
		}
		mode, err := parseMode(modeText, 0o644)
		if err != nil {
			return err
		}
		entries = append(entries, ociimage.Entry{Kind: ociimage.File, Path: dst, Content: []byte(text), Mode: mode})
	}
	for _, d := range dirs {
		dst, modeText, _ := strings.Cut(d, ":")
		mode, err := parseMode(modeText, 0o755)
		if err != nil {
			return fmt.Errorf("--dir %s: %w", d, err)
		}
		entries = append(entries, ociimage.Entry{Kind: ociimage.Dir, Path: dst, Mode: mode})
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok {
			return fmt.Errorf("--symlink %q is not DST:TARGET", l)
		}
		entries = append(entries, ociimage.Entry{Kind: ociimage.Symlink, Path: dst, Target: target, Mode: 0o777})
	}
	cfg := ociimage.Config{Entrypoint: entrypoint, Cmd: cmd, Env: env, User: *user, WorkingDir: *workdir}
	var target *ociimage.Platform
	if *platformText != "" {
		p, err := ociimage.ParsePlatform(*platformText)
		if err != nil {
			return err
		}
		target = &p
	}
	keyRef := *ref
	if target != nil {
		keyRef += " " + *platformText
	}
	key, err := ociimage.InputKey(keyRef, entries, cfg)
	if err != nil {
		return err
	}
	keyFile := *out + ".key"
	if old, err := os.ReadFile(keyFile); err == nil && string(old) == key {
		if _, err := os.Stat(*out); err == nil {
			logger.Printf("%s: unchanged, kept %s", *ref, *out)
			fmt.Println(*out)
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	build := ociimage.Build
	if target != nil {
		build = func(w io.Writer, ref string, entries []ociimage.Entry, cfg ociimage.Config, tmpDir string) error {
			return ociimage.BuildPlatform(w, ref, *target, entries, cfg, tmpDir)
		}
	}
	if err := build(tmp, *ref, entries, cfg, filepath.Dir(*out)); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	os.Remove(keyFile)
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, []byte(key), 0o644); err != nil {
		return err
	}
	logger.Printf("%s: built %s", *ref, *out)
	fmt.Println(*out)
	return nil
}

// imagesIndex combines single-platform archives into one multi-platform archive.
func imagesIndex(args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("images index", flag.ExitOnError)
	ref := fs.String("ref", "", "the image's full reference")
	out := fs.String("out", "", "the OCI archive to write")
	_ = fs.Parse(args)
	if *ref == "" || *out == "" || fs.NArg() == 0 {
		return errors.New("images index needs --ref, --out and the single-platform archives")
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".index-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := ociimage.Index(tmp, *ref, fs.Args()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}
	logger.Printf("%s: %d platforms in %s", *ref, fs.NArg(), *out)
	fmt.Println(*out)
	return nil
}

func imagesImport(ctx context.Context, args []string, logger *log.Logger) error {
	fs := flag.NewFlagSet("images import", flag.ExitOnError)
	stateDir := fs.String("state-dir", "", "import into every node's containerd of the cluster in this state dir")
	address := fs.String("address", "", "import into the containerd at this socket")
	ctr := fs.String("ctr", "", "the ctr binary (default: the cluster's)")
	_ = fs.Parse(args)
	archives := fs.Args()
	var sockets []string
	switch {
	case *address != "" && *stateDir == "":
		sockets = []string{*address}
	case *stateDir != "" && *address == "":
		layout := harness.Layout{StateDir: *stateDir}
		plan, err := harness.ReadPlan(layout.PlanFile())
		if err != nil {
			return err
		}
		if plan.Runtime != harness.RuntimeContainerd {
			return fmt.Errorf("the cluster in %s runs the %s runtime, which has no images to import into", *stateDir, plan.Runtime)
		}
		for i := 1; i <= plan.Nodes; i++ {
			sockets = append(sockets, layout.Containerd(i).Socket())
		}
		if *ctr == "" {
			*ctr = filepath.Join(plan.BinDir, "ctr")
		}
	default:
		return errors.New("images import needs exactly one of --state-dir and --address")
	}
	if *ctr == "" {
		return errors.New("images import --address needs --ctr")
	}
	if len(archives) == 0 {
		return errors.New("images import: name at least one OCI archive")
	}
	for _, socket := range sockets {
		for _, archive := range archives {
			cmd := exec.CommandContext(ctx, *ctr, "--address", socket, "--namespace", "k8s.io", "images", "import", "--local", archive)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("import %s into %s: %w: %s", archive, socket, err, strings.TrimSpace(string(out)))
			}
			logger.Printf("imported %s into %s", filepath.Base(archive), socket)
		}
	}
	return nil
}
