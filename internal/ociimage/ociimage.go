// Package ociimage writes a one-layer container image tar in the `docker save` format, which `docker load`,
// `podman load` and `ctr images import` read, from a list of files, without Docker or a registry: the installer
// image (k8s/installerimage) and the end-to-end tests' workload images (integration/testenv) are packed with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// File is one entry of an image layer.
type File struct {
	Path    string // in the image
	Src     string // host file to copy ("" for a directory or symlink)
	Link    string // symlink target
	Mode    int64
	Content []byte
}

// SharedLibs lists the shared libraries (and the loader) the given ELF files need, as ldd resolves them (none for a
// static binary).
func SharedLibs(files ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		o, err := run(30*time.Second, "ldd", f)
		if err != nil && strings.Contains(o, "not a dynamic executable") {
			continue // static: needs nothing
		}
		if err != nil {
			return nil, fmt.Errorf("ldd %s: %v: %s", f, err, o)
		}
		for _, line := range strings.Split(o, "\n") {
			for _, w := range strings.Fields(line) {
				if strings.HasPrefix(w, "/") && !seen[w] {
					seen[w] = true
					out = append(out, w)
				}
			}
		}
	}
	return out, nil
}

// WriteImage writes to path a one-layer image tagged tag in the `docker save` format, which both `docker load` and
// `ctr images import` read. cfg is the image config's "config" object (Env, Cmd, ...).
func WriteImage(path, tag string, files []File, cfg map[string]any) (string, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	mkdir := func(d string) error {
		if d == "." || d == "" || dirs[d] {
			return nil
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "tmp", "run", "usr", "usr/lib", "usr/local", "usr/local/bin"} {
		if err := mkdir(d); err != nil {
			return "", err
		}
	}
	for _, f := range files {
		parts := strings.Split(filepath.Dir(f.Path), "/")
		for i := range parts {
			if err := mkdir(strings.Join(parts[:i+1], "/")); err != nil {
				return "", err
			}
		}
		switch {
		case f.Link != "":
			if err := tw.WriteHeader(&tar.Header{Name: f.Path, Typeflag: tar.TypeSymlink, Linkname: f.Link, Mode: 0o777}); err != nil {
				return "", err
			}
		default:
			data := f.Content
			if f.Src != "" {
				var err error
				if data, err = os.ReadFile(f.Src); err != nil {
					return "", err
				}
			}
			if err := tw.WriteHeader(&tar.Header{Name: f.Path, Typeflag: tar.TypeReg, Mode: f.Mode, Size: int64(len(data))}); err != nil {
				return "", err
			}
			if _, err := tw.Write(data); err != nil {
				return "", err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	sum := sha256.Sum256(layer.Bytes())
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	config := map[string]any{"architecture": "amd64", "os": "linux", "config": cfg,
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"created": "2026-01-01T00:00:00Z"}
	cfgData, _ := json.Marshal(config)
	csum := sha256.Sum256(cfgData)
	cfgName := hex.EncodeToString(csum[:]) + ".json"
	manifest, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{tag},
		"Layers": []string{"layer/layer.tar"}}})
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	ow := tar.NewWriter(f)
	add := func(n string, data []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(ow, bytes.NewReader(data))
		return err
	}
	if err := ow.WriteHeader(&tar.Header{Name: "layer/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return "", err
	}
	for _, it := range []struct {
		n string
		d []byte
	}{{"layer/layer.tar", layer.Bytes()}, {cfgName, cfgData}, {"manifest.json", manifest}} {
		if err := add(it.n, it.d); err != nil {
			return "", err
		}
	}
	return path, ow.Close()
}

func run(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
