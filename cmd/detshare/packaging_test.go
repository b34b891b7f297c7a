package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
)

// debScript runs packaging/deb/<name> with a stub detshare (DETSHARE_BIN) and stub systemctl first on PATH; the stub
// detshare prints the lines of $dir/tenants for `tenants` and logs every call. It returns the exit error, stderr and
// the calls.
func debScript(t *testing.T, name, tenants string, env []string, args ...string) (error, string, string) {
	t.Helper()
	dir := t.TempDir()
	stub := "#!/bin/sh\necho \"$(basename \"$0\") $*\" >> " + filepath.Join(dir, "calls") + "\n" +
		"if [ \"$1\" = tenants ]; then cat " + filepath.Join(dir, "tenants") + "; fi\n"
	for _, b := range []string{"detshare", "systemctl"} {
		if err := os.WriteFile(filepath.Join(dir, b), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "tenants"), []byte(tenants), 0o644)
	cmd := exec.Command("sh", append([]string{filepath.Join("..", "..", "packaging", "deb", name)}, args...)...)
	cmd.Env = append([]string{"PATH=" + dir + ":/usr/bin:/bin", "DETSHARE_BIN=" + filepath.Join(dir, "detshare")}, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	calls, _ := os.ReadFile(filepath.Join(dir, "calls"))
	return err, stderr.String(), string(calls)
}

// Removing the package while tenants run would leave their engines unable to stop them: prerm refuses, listing
// them and saying how to drain or force; without tenants, or forced, it unregisters; an upgrade keeps everything.
func TestDebPrermRefusesRemovalWhileTenantsRun(t *testing.T) {
	running := "c0ffee\tburstable\tgpu 0\nweb-1\tlatency-critical\tgpu 0\n"
	err, stderr, calls := debScript(t, "prerm", running, nil, "remove")
	if err == nil || !strings.Contains(stderr, "refusing removal: 2 DetShare tenant(s)") || !strings.Contains(stderr, "  c0ffee") ||
		!strings.Contains(stderr, "  web-1") || !strings.Contains(stderr, "docker stop") || !strings.Contains(stderr, "DETSHARE_FORCE_REMOVE=1") {
		t.Errorf("prerm remove with tenants: %v\n%s", err, stderr)
	}
	if strings.Contains(calls, "uninstall") || strings.Contains(calls, "systemctl") {
		t.Errorf("refused removal still changed the host: %s", calls)
	}
	for _, c := range []struct {
		name, tenants string
		env           []string
	}{{"no tenants", "", nil}, {"forced", running, []string{"DETSHARE_FORCE_REMOVE=1"}}} {
		err, stderr, calls := debScript(t, "prerm", c.tenants, c.env, "remove")
		if err != nil || !strings.Contains(calls, "detshare uninstall all") {
			t.Errorf("%s: prerm remove: %v, calls %q\n%s", c.name, err, calls, stderr)
		}
	}
	if err, stderr, calls := debScript(t, "prerm", running, nil, "upgrade", "0.2"); err != nil || calls != "" {
		t.Errorf("prerm upgrade: %v, calls %q\n%s", err, calls, stderr)
	}
}

// postinst restarts a scheduler left on the replaced binary.
func TestDebPostinstRestartsAStaleScheduler(t *testing.T) {
	err, stderr, calls := debScript(t, "postinst", "", nil, "configure", "0.1")
	if err != nil || !strings.Contains(calls, "detshare sched-restart --if-stale") {
		t.Errorf("postinst configure: %v, calls %q\n%s", err, calls, stderr)
	}
}

// `detshare tenants` (what prerm asks) lists registered tenants and prints nothing without a table.
func TestTenantsListsRegistrations(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	runDir := filepath.Join(t.TempDir(), "run")
	if out, err := runCLI(t, "--run-dir", runDir, "tenants"); err != nil || out != "" {
		t.Fatalf("no table: %q, %v", out, err)
	}
	reg := tenant.Registrar{DiscoverGPUs: simgpu.Discover}
	if _, err := reg.Register(context.Background(), runDir, tenant.Request{ID: "c0ffee",
		Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=burstable", "DETSHARE_SMS=8"}}.Resolve()}); err != nil {
		t.Fatal(err)
	}
	defer tenant.Deregister(runDir, "c0ffee")
	out, err := runCLI(t, "--run-dir", runDir, "tenants")
	if err != nil || !strings.HasPrefix(out, "c0ffee\tburstable\tgpu 0") {
		t.Errorf("tenants: %q, %v", out, err)
	}
	if out, _ := runCLI(t, "--run-dir", runDir, "tenants", "-q"); out != "c0ffee\n" {
		t.Errorf("tenants -q: %q", out)
	}
}
