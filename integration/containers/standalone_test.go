package containers

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
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
func (e *env) standaloneBundle(t *testing.T, env []string, script string, edits ...func(spec map[string]any)) string {
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
	for _, edit := range edits {
		edit(spec)
	}
	data, _ = json.Marshal(spec)
	os.WriteFile(filepath.Join(b, "config.json"), data, 0o644)
	return b
}

// When runc fails after the createContainer hook registered the container, no poststop runs; the registration is
// owned by the container's init process, so the reaper of the scheduler (started on demand by the hook)
// deregisters it once that process is gone.
func TestStandaloneHookFailureAfterHookIsReaped(t *testing.T) {
	e := need(t)
	id := "ds-standalone-late-fail"
	// On hooks.d hosts the scheduler runs as a service; here it is started as sched/ensure would.
	t.Setenv(ensure.BinEnv, filepath.Join(e.bin, "detshare"))
	t.Setenv("DETSHARE_SIMGPU", "1")
	if err := ensure.EnsureScheduler(e.runDir); err != nil {
		t.Fatalf("start the scheduler: %v", err)
	}
	// runc applies sysctls after the rootfs is prepared (and createContainer hooks have run): a sysctl that does not
	// exist fails the create at that point.
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=best-effort"}, "true", func(spec map[string]any) {
		spec["linux"].(map[string]any)["sysctl"] = map[string]string{"net.ipv4.detshare_no_such_sysctl": "1"}
		// No poststop hook: runc may run it when its own create fails, but podman/conmon do not call runc delete
		// for a container whose create failed, so the reaper must do it.
		delete(spec["hooks"].(map[string]any), "poststop")
	})
	root := filepath.Join(e.dir, "runc-root")
	out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
	if err == nil {
		t.Fatalf("runc run succeeded with a nonexistent sysctl: %s", out)
	}
	if !strings.Contains(out, "detshare_no_such_sysctl") {
		t.Fatalf("runc failed for another reason than the sysctl (the test needs a failure after the hook):\n%s", out)
	}
	// The hook did register and mount before the failure: its mount point exists in the rootfs.
	if _, err := os.Stat(filepath.Join(b, "rootfs", table.ContainerQuotaPath)); err != nil {
		t.Fatalf("the createContainer hook did not get to mount (the failure came before it): %v", err)
	}
	run(30*time.Second, nil, "runc", "--root", root, "delete", "--force", id)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := e.lookup(t, id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("registration of a container whose create failed after the hook was not reaped within 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.assertNoLeak(t, id)
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
	if ms := testenv.MountsUnder(b); len(ms) != 0 {
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

// A FIFO the image puts at a DetShare mount target makes the standalone hook refuse the container at once, naming
// the path and the type; opening it blocked the hook (and the create) forever while it held a table slot.
func TestStandaloneHookRefusesFIFOAtTarget(t *testing.T) {
	e := need(t)
	id := "ds-standalone-fifo"
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable"}, "true")
	preload := filepath.Join(b, "rootfs", table.ContainerLdPreloadPath)
	os.Remove(preload)
	if err := unix.Mkfifo(preload, 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(e.dir, "runc-root")
	start := time.Now()
	out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
	if err == nil {
		t.Fatalf("runc run succeeded with a FIFO at %s: %s", table.ContainerLdPreloadPath, out)
	}
	if d := time.Since(start); d > 30*time.Second || !strings.Contains(out, table.ContainerLdPreloadPath) ||
		!strings.Contains(out, "FIFO") {
		t.Errorf("after %s, runc's error does not name the path and the FIFO:\n%s", d, out)
	}
	run(30*time.Second, nil, "runc", "--root", root, "delete", "--force", id)
	e.assertNoLeak(t, id)
}

// The standalone registration is owned by the container's init process (host PID), which is what lets the reaper
// clean up after a create that fails after the hook.
func TestStandaloneHookOwnerIsContainerInit(t *testing.T) {
	e := need(t)
	id := "ds-standalone-owner"
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=best-effort"}, "exec sleep 3")
	root := filepath.Join(e.dir, "runc-root")
	done := make(chan string, 1)
	go func() {
		out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
		if err != nil {
			out = "ERROR " + err.Error() + ": " + out
		}
		done <- out
	}()
	r := e.waitRegistered(t, id)
	if r.OwnerPID <= 1 {
		t.Fatalf("registration has no owner: %+v", r)
	}
	var cmd []byte
	for i := 0; i < 50; i++ {
		cmd, _ = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.OwnerPID))
		if strings.HasPrefix(string(cmd), "sleep") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.HasPrefix(string(cmd), "sleep") {
		t.Errorf("owner pid %d runs %q, want the container's process (sleep)", r.OwnerPID, cmd)
	}
	if out := <-done; strings.HasPrefix(out, "ERROR") {
		t.Fatal(out)
	}
	e.assertNoLeak(t, id)
}

// The standalone hook (podman, CRI-O) follows the same failure policy: with the library missing a container that
// asked for DetShare is refused by default; under fail-open it runs and the hook's WARNING line is the first line of
// the container's own stderr (written to the container init's fd 2).
func TestStandaloneHookFailurePolicy(t *testing.T) {
	e := need(t)
	root := filepath.Join(e.dir, "runc-root")
	for _, c := range []struct {
		id, extra string
		wantRun   bool
	}{
		{"ds-standalone-refused", "DETSHARE_FAIL_CLOSED=0", false},
		{"ds-standalone-open", "DETSHARE_FAIL_OPEN=1", true},
	} {
		b := e.standaloneBundle(t, []string{"DETSHARE_TIER=latency-critical", "DETSHARE_SMS=8"}, "echo RAN", func(spec map[string]any) {
			hooks := spec["hooks"].(map[string]any)
			for _, stage := range []string{"createContainer", "poststop"} {
				h := hooks[stage].([]any)[0].(map[string]any)
				h["env"] = []string{"DETSHARE_SIMGPU=1", "DETSHARE_RUN_DIR=" + e.runDir, "DETSHARE_LIB=/nonexistent/libdetshare.so",
					"DETSHARE_CONFIG=/nonexistent/config.toml", c.extra}
			}
		})
		out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, c.id)
		run(30*time.Second, nil, "runc", "--root", root, "delete", "--force", c.id)
		if c.wantRun {
			if err != nil || !strings.Contains(out, "RAN") ||
				!strings.Contains(out, "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it") {
				t.Errorf("%s: %v: %q; want it to run with the WARNING on its stderr", c.id, err, out)
			}
		} else if err == nil || strings.Contains(out, "RAN") || !strings.Contains(out, "libdetshare.so not readable") {
			t.Errorf("%s: %v: %q; want runc to fail with the hook's refusal", c.id, err, out)
		}
		e.assertNoLeak(t, c.id)
	}
}
