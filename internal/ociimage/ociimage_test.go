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
	"reflect"
	"strings"
	"testing"
)

// readTar returns a tar's entries by name (headers and contents), failing on a name written twice.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdrs[h.Name] != nil {
			t.Fatalf("%s written twice", h.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], data[h.Name] = h, b
	}
}

// TestWriteImage: the tar is what `docker load` and `ctr images import` read: a manifest naming the config by its
// digest, the tag and the one layer, a config whose diff_id is the layer's digest, and a layer holding the files
// (contents, copies, symlinks, modes) under their parent directories, each written once.
func TestWriteImage(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "tool")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	cfg := map[string]any{"Cmd": []any{"/bin/sh"}}
	got, err := WriteImage(out, "example:test", []File{
		{Path: "opt/x/bin/tool", Src: src, Mode: 0o755},
		{Path: "opt/x/etc/conf", Content: []byte("k=v\n"), Mode: 0o644},
		{Path: "bin/sh", Link: "busybox"},
	}, cfg)
	if err != nil || got != out {
		t.Fatalf("WriteImage = %q, %v", got, err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hdrs, data := readTar(t, f)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(data["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json %q: %v", data["manifest.json"], err)
	}
	m := manifest[0]
	if !reflect.DeepEqual(m.RepoTags, []string{"example:test"}) || !reflect.DeepEqual(m.Layers, []string{"layer/layer.tar"}) {
		t.Fatalf("manifest %+v", m)
	}
	csum := sha256.Sum256(data[m.Config])
	if m.Config != hex.EncodeToString(csum[:])+".json" {
		t.Fatalf("config %s is not named by its digest", m.Config)
	}
	var config struct {
		Architecture, OS string
		Config           map[string]any
		RootFS           struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(data[m.Config], &config); err != nil {
		t.Fatal(err)
	}
	lsum := sha256.Sum256(data["layer/layer.tar"])
	if !reflect.DeepEqual(config.RootFS.DiffIDs, []string{"sha256:" + hex.EncodeToString(lsum[:])}) ||
		!reflect.DeepEqual(config.Config, cfg) || config.OS != "linux" {
		t.Fatalf("config %+v", config)
	}
	if hdrs["layer/"] == nil || hdrs["layer/"].Typeflag != tar.TypeDir {
		t.Fatal("no layer/ directory")
	}
	lh, ld := readTar(t, bytes.NewReader(data["layer/layer.tar"]))
	for _, d := range []string{"bin/", "usr/local/bin/", "opt/", "opt/x/", "opt/x/bin/", "opt/x/etc/"} {
		if lh[d] == nil || lh[d].Typeflag != tar.TypeDir {
			t.Errorf("layer lacks directory %s", d)
		}
	}
	if h := lh["opt/x/bin/tool"]; h == nil || h.Mode != 0o755 || string(ld["opt/x/bin/tool"]) != "#!/bin/sh\n" {
		t.Errorf("copied file: %+v %q", h, ld["opt/x/bin/tool"])
	}
	if h := lh["opt/x/etc/conf"]; h == nil || h.Mode != 0o644 || string(ld["opt/x/etc/conf"]) != "k=v\n" {
		t.Errorf("file with content: %+v %q", h, ld["opt/x/etc/conf"])
	}
	if h := lh["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("symlink: %+v", h)
	}
}

// TestWriteImageMissingSource: a file that cannot be read fails the image and names the file.
func TestWriteImageMissingSource(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	_, err := WriteImage(filepath.Join(dir, "img.tar"), "x:y", []File{{Path: "bin/x", Src: missing, Mode: 0o755}}, nil)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("want an error naming %s, got %v", missing, err)
	}
}

// TestSharedLibs: a dynamic program's libraries and loader are listed as absolute paths, each once; a file ldd cannot
// read is an error naming it.
func TestSharedLibs(t *testing.T) {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	libs, err := SharedLibs(sh, sh)
	if err != nil {
		t.Fatal(err)
	}
	seen, libc := map[string]bool{}, false
	for _, l := range libs {
		if !strings.HasPrefix(l, "/") || seen[l] {
			t.Errorf("%q: want absolute paths, each once: %q", l, libs)
		}
		seen[l] = true
		libc = libc || strings.Contains(filepath.Base(l), "libc.so")
	}
	if !libc {
		t.Fatalf("%s: libc not among %q", sh, libs)
	}
	if _, err := SharedLibs("/nonexistent/program"); err == nil || !strings.Contains(err.Error(), "/nonexistent/program") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}
