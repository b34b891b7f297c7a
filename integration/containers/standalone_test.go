package containers

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/sched/table"
)

// extractRootfs unpacks the workload image's layer into dir.
func (e *env) extractRootfs(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(e.imageTar)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outer := tar.NewReader(f)
	for {
		h, err := outer.Next()
		if err != nil {
			t.Fatalf("no layer in %s: %v", e.imageTar, err)
		}
		if h.Name == "layer/layer.tar" {
			break
		}
	}
	tr := tar.NewReader(outer)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(out, tr)
			out.Close()
		}
	}
}

// standaloneBundle writes a bundle whose spec carries detshare-hook as podman/CRI-O would inject it from
// configs/hooks.d (createContainer + poststop), with no shim or wrapper involved.
func (e *env) standaloneBundle(t *testing.T, env []string, script string) string {
	t.Helper()
	b := t.TempDir()
	e.extractRootfs(t, filepath.Join(b, "rootfs"))
	if out, err := run(30*time.Second, nil, "runc", "spec", "--bundle", b); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	data, _ := os.ReadFile(filepath.Join(b, "config.json"))
	var spec map[string]any
	json.Unmarshal(data, &spec)
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/sh", "-c", script}
	proc["env"] = append([]string{"PATH=/usr/local/bin:/bin", "LD_LIBRARY_PATH=/usr/lib/simgpu"}, env...)
	spec["root"].(map[string]any)["readonly"] = false
	hookEnv := []string{"DETSHARE_SIMGPU=1", "DETSHARE_RUN_DIR=" + e.runDir,
		"DETSHARE_LIB=" + filepath.Join(e.build, "lib/libdetshare.so")}
	hookBin := filepath.Join(e.bin, "detshare-hook")
	spec["hooks"] = map[string]any{
		"createContainer": []any{map[string]any{"path": hookBin, "args": []string{"detshare-hook", "createContainer"}, "env": hookEnv}},
		"poststop":        []any{map[string]any{"path": hookBin, "args": []string{"detshare-hook", "poststop"}, "env": hookEnv}},
	}
	data, _ = json.Marshal(spec)
	os.WriteFile(filepath.Join(b, "config.json"), data, 0o644)
	return b
}

func TestStandaloneHookWithRunc(t *testing.T) {
	e := need(t)
	id := "ds-standalone"
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable", "DETSHARE_MEMORY=640MiB"},
		"simgpu-probe meminfo; cat /run/detshare/quota; echo x > /run/detshare/quota && echo QUOTA-WRITABLE; cat /proc/self/mountinfo")
	root := filepath.Join(e.dir, "runc-root")
	out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
	if err != nil {
		t.Fatalf("runc run: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != 640<<20 {
		t.Errorf("container sees %d bytes, want 640 MiB", got)
	}
	if !strings.Contains(out, "id="+id) || strings.Contains(out, "QUOTA-WRITABLE") {
		t.Errorf("quota file missing or writable:\n%s", out)
	}
	if opts := mountOptions(out, table.ContainerTablePath); !strings.HasPrefix(opts, "ro") {
		t.Errorf("table mounted %q, want ro", opts)
	}
	if opts := mountOptions(out, table.ContainerClientPagePath); !strings.HasPrefix(opts, "rw") {
		t.Errorf("client page mounted %q, want rw", opts)
	}
	e.assertNoLeak(t, id)
	// Mount points the hook created stay in the bundle's rootfs only; nothing of it is mounted on the host.
	if ms := mountsUnder(b); len(ms) != 0 {
		t.Errorf("mounts left under the bundle: %v", ms)
	}
}

func TestStandaloneHookBadQuotaFailsRunc(t *testing.T) {
	e := need(t)
	id := "ds-standalone-bad"
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable", "DETSHARE_SMS=200%"}, "true")
	root := filepath.Join(e.dir, "runc-root")
	out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
	if err == nil {
		t.Fatalf("runc run succeeded with DETSHARE_SMS=200%%: %s", out)
	}
	if !strings.Contains(strings.ReplaceAll(out, `\"`, `"`), `DETSHARE_SMS="200%"`) {
		t.Errorf("runc's error does not name the field:\n%s", out)
	}
	run(30*time.Second, nil, "runc", "--root", root, "delete", "--force", id)
	e.assertNoLeak(t, id)
}
