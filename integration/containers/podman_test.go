package containers

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/detshare/detshare/sched/ensure"
)

var (
	podmanOnce sync.Once
	podmanArgs []string
	podmanEnv  []string
	podmanErr  error
)

// podman runs podman on private storage with the hooks directory built from configs/hooks.d (only the hook's path
// and environment differ from the shipped files).
func (e *env) podman(args ...string) (string, error) {
	return run(90*time.Second, podmanEnv, "podman", append(append([]string{}, podmanArgs...), args...)...)
}

func needPodman(t *testing.T) *env {
	t.Helper()
	e := need(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman not found: apt-get install podman (.ci/run does); DETSHARE_SKIP_CONTAINERS=1 skips")
	}
	podmanOnce.Do(func() { podmanErr = e.setupPodman() })
	if podmanErr != nil {
		t.Fatalf("podman not usable: %v", podmanErr)
	}
	return e
}

func (e *env) setupPodman() error {
	dir := filepath.Join(e.dir, "podman")
	hooks := filepath.Join(dir, "hooks.d")
	if err := os.MkdirAll(hooks, 0o755); err != nil {
		return err
	}
	// podman's blob-info cache, outside its --root
	e.noteHostDirs("/var/lib/containers/cache/blob-info-cache-v1.boltdb", "/var/lib/containers/cache", "/var/lib/containers")
	shipped, _ := filepath.Glob(filepath.Join(e.repo, "configs/hooks.d/*.json"))
	if len(shipped) != 2 {
		return fmt.Errorf("configs/hooks.d has %d hook files, want 2", len(shipped))
	}
	for _, f := range shipped {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var h map[string]any
		if err := json.Unmarshal(data, &h); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		hk := h["hook"].(map[string]any)
		hk["path"] = filepath.Join(e.bin, "detshare-hook")
		hk["env"] = []string{"DETSHARE_SIMGPU=1", "DETSHARE_RUN_DIR=" + e.runDir,
			"DETSHARE_LIB=" + filepath.Join(e.build, "lib/libdetshare.so")}
		out, _ := json.Marshal(h)
		if err := os.WriteFile(filepath.Join(hooks, filepath.Base(f)), out, 0o644); err != nil {
			return err
		}
	}
	// The CI sandbox refuses podman's default rlimits (RLIMIT_NOFILE/NPROC above its hard limits).
	conf := filepath.Join(dir, "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\npids_limit = 0\n"), 0o644); err != nil {
		return err
	}
	podmanEnv = append(os.Environ(), "CONTAINERS_CONF="+conf)
	podmanArgs = []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "runroot"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
		"--events-backend", "file", "--hooks-dir", hooks}
	if out, err := e.podman("load", "-i", e.imageTar); err != nil {
		return fmt.Errorf("podman load: %v: %s", err, out)
	}
	return nil
}

const podmanImage = "localhost/detshare-e2e:test"

// podman with configs/hooks.d: the standalone hook registers the container, mounts DetShare's files, the library
// works in the main and an exec'd process, and poststop deregisters.
func TestPodmanHooksDir(t *testing.T) {
	e := needPodman(t)
	// hooks.d hosts run the scheduler as a service; start it as sched/ensure would.
	t.Setenv(ensure.BinEnv, filepath.Join(e.bin, "detshare"))
	t.Setenv("DETSHARE_SIMGPU", "1")
	if err := ensure.EnsureScheduler(e.runDir); err != nil {
		t.Fatalf("start the scheduler: %v", err)
	}
	out, err := e.podman("run", "-d", "--network", "none", "-e", "DETSHARE_TIER=burstable", "-e", "DETSHARE_MEMORY=300MiB",
		podmanImage, "sh", "-c", "simgpu-probe meminfo > /tmp/main.out 2>&1; exec sleep 300")
	if err != nil {
		t.Fatalf("podman run: %v: %s", err, out)
	}
	id := strings.TrimSpace(out)
	defer e.podman("rm", "-f", "-t", "0", id)
	r := e.waitRegistered(t, id)
	if r.MemLimit != 300<<20 {
		t.Errorf("registration %+v: want 300 MiB", r)
	}
	pid, _ := e.podman("inspect", "-f", "{{.State.Pid}}", id)
	if strings.TrimSpace(pid) != fmt.Sprint(r.OwnerPID) {
		t.Errorf("registration owned by pid %d, container init is %s", r.OwnerPID, pid)
	}
	exec := func(args ...string) (string, error) { return e.podman(append([]string{"exec", id}, args...)...) }
	checkInside(t, exec, id, 300<<20)
	main, _ := exec("cat", "/tmp/main.out")
	if got := meminfoTotal(t, main); got != 300<<20 {
		t.Errorf("main process sees %d bytes", got)
	}
	if out, err := e.podman("rm", "-f", "-t", "0", id); err != nil { // sleep as PID 1 ignores SIGTERM
		t.Fatalf("podman rm: %v: %s", err, out)
	}
	e.assertNoLeak(t, id)
}

func TestPodmanBadQuotaFailsAndLeavesNothing(t *testing.T) {
	e := needPodman(t)
	out, err := e.podman("run", "--name", "ds-podman-bad", "--network", "none", "-e", "DETSHARE_TIER=burstable",
		"-e", "DETSHARE_SMS=200%", podmanImage, "true")
	if err == nil {
		t.Fatalf("podman run succeeded with DETSHARE_SMS=200%%: %s", out)
	}
	t.Logf("refusal as the user sees it: %s", strings.TrimSpace(out))
	if !strings.Contains(strings.ReplaceAll(out, `\"`, `"`), `DETSHARE_SMS="200%"`) {
		t.Errorf("error does not name the field:\n%s", out)
	}
	id, _ := e.podman("inspect", "-f", "{{.Id}}", "ds-podman-bad")
	id = strings.TrimSpace(id)
	if id == "" {
		t.Fatal("no container id")
	}
	e.assertNoLeak(t, id)
	e.podman("rm", "-f", id)
}
