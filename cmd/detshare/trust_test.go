package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunPrivilegeDropKeepsDetShare is issue 13 item 7 (setpriv) for host tenants: the command of `detshare run`
// drops to nobody with a statically linked tool (busybox su, like gosu or su-exec: libdetshare is not loaded
// into it) before it execs the CUDA program. The program must keep the tenant's quota: before the fix it could
// not open the client page and ran without DetShare (its 1.5 GiB allocation in a 1 GiB tenant succeeded).
func TestRunPrivilegeDropKeepsDetShare(t *testing.T) {
	bd := buildDir()
	lib := filepath.Join(bd, "lib", "libdetshare.so")
	probe := filepath.Join(bd, "tests", "ds_probe_rt")
	sim := filepath.Join(bd, "lib", "simgpu")
	for _, f := range []string{lib, probe, filepath.Join(sim, "libcuda.so.1"), "/bin/busybox"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s missing: run `make build` first (busybox: apt-get install busybox-static)", f)
		}
	}
	e := newRunEnv(t)
	e.lib = lib
	// As on a host, the run directory's public files (table, quota file) are reachable by every user; the test's
	// temporary directories are 0700, and the simulated GPU's state file must be writable by nobody.
	for d := e.dir; strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	cmd := e.detshare("run", "--memory", "1Gi", "--name", "dropper", "--", "/bin/busybox", "su", "-p", "-s", "/bin/sh",
		"nobody", "-c", probe+" init alloc:536870912 alloc:1073741824")
	cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+sim, "DETSHARE_SIMGPU_STATE="+filepath.Join(e.dir, "simgpu.state"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("detshare run: %v\n%s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "alloc:536870912 rc=0") {
		t.Errorf("allocation within the limit failed as nobody:\n%s", s)
	}
	if !strings.Contains(s, "alloc:1073741824 rc=2") {
		t.Errorf("as nobody, 1.5 GiB in a 1 GiB tenant was not refused (DetShare lost after the privilege drop):\n%s", s)
	}
	if strings.Contains(s, "running unshared") {
		t.Errorf("the library ran unshared:\n%s", s)
	}
}
