package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/table"
)

// TestMain lets the tests run this test binary as the detshare command (DETSHARE_TEST_MAIN=1), so `detshare run`
// is exercised as a real process: signals, exit codes, its own death.
func TestMain(m *testing.M) {
	if os.Getenv("DETSHARE_TEST_MAIN") == "1" {
		os.Args = append([]string{"detshare"}, strings.Fields(os.Getenv("DETSHARE_TEST_ARGS"))...)
		if i := os.Getenv("DETSHARE_TEST_ARGS_SEP"); i != "" {
			os.Args = append([]string{"detshare"}, strings.Split(os.Getenv("DETSHARE_TEST_ARGS"), i)...)
		}
		main()
		os.Exit(0)
	}
	logrus.SetLevel(logrus.WarnLevel)
	// These tests are about `detshare run`, not the scheduler: registration's start-the-scheduler step
	// (sched/ensure) gets a binary that exits at once, so no daemon outlives a test.
	os.Setenv("DETSHARE_BIN", "/bin/false")
	code := m.Run()
	if fakeBinDir != "" {
		os.RemoveAll(fakeBinDir)
	}
	os.Exit(code)
}

type runEnv struct {
	dir, runDir, lib string
}

func newRunEnv(t *testing.T) runEnv {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libdetshare.so")
	os.WriteFile(lib, []byte("not really a library"), 0o644)
	return runEnv{dir: dir, runDir: filepath.Join(dir, "run"), lib: lib}
}

// detshare returns a command running `detshare <args>` with the simulated GPU (a test double) selected.
func (e runEnv) detshare(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DETSHARE_TEST_MAIN=1", "DETSHARE_TEST_ARGS_SEP=\x1f",
		"DETSHARE_TEST_ARGS="+strings.Join(args, "\x1f"), "DETSHARE_RUN_DIR="+e.runDir, "DETSHARE_SIMGPU=1",
		"DETSHARE_LIB="+e.lib, "LD_PRELOAD=")
	return cmd
}

// script writes a shell script that records its environment and PID, then waits for a "go" file and exits with
// the given code.
func (e runEnv) script(t *testing.T, name string, code int) string {
	p := filepath.Join(e.dir, name+".sh")
	// The traps come first: the PID file tells the test that signals will be caught.
	s := fmt.Sprintf(`#!/bin/sh
trap 'echo TERM > %[1]s/%[2]s.sig; exit 143' TERM
trap 'echo INT > %[1]s/%[2]s.sig; exit 130' INT
env > %[1]s/%[2]s.env
cat "$DETSHARE_QUOTA_FILE" > %[1]s/%[2]s.quota 2>/dev/null
echo $$ > %[1]s/%[2]s.pid
i=0
while [ ! -e %[1]s/%[2]s.go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
exit %[3]d
`, e.dir, name, code)
	if err := os.WriteFile(p, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitFile(t *testing.T, path string) []byte {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return nil
}

func lookup(t *testing.T, runDir, id string) (tenant.Result, bool) {
	t.Helper()
	r, ok, err := tenant.Lookup(runDir, id)
	if err != nil {
		t.Fatal(err)
	}
	return r, ok
}

func exitCode(t *testing.T, cmd *exec.Cmd, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run detshare: %v", err)
	}
	return cmd.ProcessState.ExitCode()
}

func TestRunRegistersWhileCommandRuns(t *testing.T) {
	e := newRunEnv(t)
	cmd := e.detshare("run", "--tier", "burstable", "--sm", "16", "--memory", "4Gi", "--weight", "2", "--name", "job1", "--",
		e.script(t, "job1", 7))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(e.dir, "job1.pid")) // written last
	env := string(waitFile(t, filepath.Join(e.dir, "job1.env")))
	res, ok := lookup(t, e.runDir, "job1")
	if !ok {
		t.Fatalf("job1 not registered while its command runs; stderr:\n%s", stderr.String())
	}
	r := res.Registration
	if !r.HostTenant() || r.OwnerPID != cmd.Process.Pid || r.Tier != table.TierBurstable || r.SMs != 16 || r.MemLimit != 4<<30 || r.Weight != 2 {
		t.Errorf("registration %+v (detshare pid %d)", r, cmd.Process.Pid)
	}
	for _, want := range []string{"DETSHARE_QUOTA_FILE=" + res.QuotaFile, "LD_PRELOAD=" + e.lib, "DETSHARE_TENANT=job1",
		"DETSHARE_RUN_DIR=" + e.runDir} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("CMD environment lacks %q", want)
		}
	}
	qf, err := quota.ParseFile(waitFile(t, filepath.Join(e.dir, "job1.quota")))
	if err != nil || qf.ID != "job1" || qf.Slot != r.Slot || qf.SlotGen != r.Gen {
		t.Errorf("quota file seen by CMD: %+v %v", qf, err)
	}
	os.WriteFile(filepath.Join(e.dir, "job1.go"), []byte("1"), 0o644)
	if code := exitCode(t, cmd, cmd.Wait()); code != 7 {
		t.Errorf("exit %d, want CMD's 7; stderr:\n%s", code, stderr.String())
	}
	if _, ok := lookup(t, e.runDir, "job1"); ok {
		t.Error("job1 still registered after CMD exited")
	}
	if _, err := os.Stat(res.QuotaFile); !errors.Is(err, os.ErrNotExist) {
		t.Error("quota file left behind")
	}
}

func TestRunCommandKilled(t *testing.T) {
	e := newRunEnv(t)
	cmd := e.detshare("run", "--name", "victim", "--", e.script(t, "victim", 0))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(waitFile(t, filepath.Join(e.dir, "victim.pid")))))
	if _, ok := lookup(t, e.runDir, "victim"); !ok {
		t.Fatal("not registered")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	if code := exitCode(t, cmd, cmd.Wait()); code != 128+9 {
		t.Errorf("exit %d, want 137", code)
	}
	if _, ok := lookup(t, e.runDir, "victim"); ok {
		t.Error("still registered after CMD was killed")
	}
}

func TestRunForwardsSignalsAndDeregisters(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
		code int
	}{{syscall.SIGTERM, "TERM", 143}, {syscall.SIGINT, "INT", 130}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newRunEnv(t)
			cmd := e.detshare("run", "--name", "sig", "--", e.script(t, "sig", 0))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitFile(t, filepath.Join(e.dir, "sig.pid"))
			if _, ok := lookup(t, e.runDir, "sig"); !ok {
				t.Fatal("not registered")
			}
			cmd.Process.Signal(tc.sig)
			if code := exitCode(t, cmd, cmd.Wait()); code != tc.code {
				t.Errorf("exit %d, want CMD's %d", code, tc.code)
			}
			if got := string(waitFile(t, filepath.Join(e.dir, "sig.sig"))); got != tc.name+"\n" {
				t.Errorf("CMD got %q, want %s", got, tc.name)
			}
			if _, ok := lookup(t, e.runDir, "sig"); ok {
				t.Error("still registered after the signal")
			}
		})
	}
}

// TestRunDetshareKilled: when detshare itself is SIGKILLed nothing can deregister at once; the tenant is reaped by
// the next registration (or the scheduler) because its owner is dead.
func TestRunDetshareKilled(t *testing.T) {
	e := newRunEnv(t)
	cmd := e.detshare("run", "--name", "orphan", "--", e.script(t, "orphan", 0))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(e.dir, "orphan.pid"))
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	os.WriteFile(filepath.Join(e.dir, "orphan.go"), []byte("1"), 0o644) // let the orphaned script end
	t.Setenv("DETSHARE_SIMGPU", "1")
	if _, err := hostRegistrar().Register(context.Background(), e.runDir, tenant.Request{ID: "next", Quota: quota.Inputs{}.Resolve()}); err != nil {
		t.Fatal(err)
	}
	if _, ok := lookup(t, e.runDir, "orphan"); ok {
		t.Error("tenant of a killed detshare was not reaped by the next registration")
	}
}

func TestRunJoin(t *testing.T) {
	e := newRunEnv(t)
	owner := e.detshare("run", "--name", "shared", "--memory", "1Gi", "--", e.script(t, "owner", 0))
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.WriteFile(filepath.Join(e.dir, "owner.go"), []byte("1"), 0o644)
		owner.Wait()
	}()
	waitFile(t, filepath.Join(e.dir, "owner.pid"))
	res, _ := lookup(t, e.runDir, "shared")
	join := e.detshare("run", "--join", "shared", "--", "sh", "-c", `echo "$DETSHARE_QUOTA_FILE|$DETSHARE_TENANT|$LD_PRELOAD"`)
	out, err := join.Output()
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != res.QuotaFile+"|shared|"+e.lib {
		t.Errorf("joined CMD saw %q", got)
	}
	tb, _ := table.OpenReadOnly(e.runDir)
	defer tb.Close()
	if n := len(tb.List()); n != 1 {
		t.Errorf("join registered something: %d tenants", n)
	}
	if _, ok := lookup(t, e.runDir, "shared"); !ok {
		t.Error("join deregistered the tenant")
	}
	bad := e.detshare("run", "--join", "nope", "--", "true")
	out, err = bad.CombinedOutput()
	if code := exitCode(t, bad, err); code != 125 || !strings.Contains(string(out), "--join nope: no such tenant") {
		t.Errorf("join of a missing tenant: %d %s", code, out)
	}
	bad = e.detshare("run", "--join", "shared", "--tier", "burstable", "--", "true")
	out, err = bad.CombinedOutput()
	if code := exitCode(t, bad, err); code != 125 || !strings.Contains(string(out), "--tier cannot be combined with --join") {
		t.Errorf("join with a quota flag: %d %s", code, out)
	}
}

func TestRunRefusesBadQuotaWithoutRunning(t *testing.T) {
	e := newRunEnv(t)
	marker := filepath.Join(e.dir, "ran")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tier", "gold"}, `--tier="gold" (flag): allowed values are latency-critical, burstable, best-effort`},
		{[]string{"--tier", "burstable", "--sm", "200%"}, `--sm="200%" (flag): percent must be in 1..100`},
		{[]string{"--tier", "latency-critical", "--sm", "128"}, `--sm="128" (flag): on GPU 0`},
		{[]string{"--name", "no/slash"}, "tenant id"},
	} {
		cmd := e.detshare(append(append([]string{"run"}, tc.args...), "--", "touch", marker)...)
		out, err := cmd.CombinedOutput()
		if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: exit %d, output %q; want 125 and %q", tc.args, code, out, tc.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CMD ran although the quota was refused")
	}
	cmd := e.detshare("run")
	out, err := cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), "missing CMD") {
		t.Errorf("no CMD: %d %s", code, out)
	}
	cmd = e.detshare("run", "--name", "nocmd", "--", filepath.Join(e.dir, "no-such-command"))
	out, err = cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), "no-such-command") {
		t.Errorf("missing command: %d %s", code, out)
	}
	if _, ok := lookup(t, e.runDir, "nocmd"); ok {
		t.Error("tenant left registered after its command failed to start")
	}
}

// TestRunFailsOpen: when the table cannot be used at all, CMD still runs (without DetShare), unless --strict.
func TestWithVisibleGPU(t *testing.T) {
	real := table.GPUState{GPUInfo: table.GPUInfo{UUID: "GPU-1234"}}
	if got := getEnv(withVisibleGPU([]string{"A=1"}, real), "CUDA_VISIBLE_DEVICES"); got != "GPU-1234" {
		t.Errorf("unset: %q", got)
	}
	if got := getEnv(withVisibleGPU([]string{"CUDA_VISIBLE_DEVICES=0,1"}, real), "CUDA_VISIBLE_DEVICES"); got != "0,1" {
		t.Errorf("user's choice overridden: %q", got)
	}
	sim := table.GPUState{GPUInfo: table.GPUInfo{UUID: "SIM-0"}}
	if got := getEnv(withVisibleGPU([]string{"A=1"}, sim), "CUDA_VISIBLE_DEVICES"); got != "" {
		t.Errorf("simulated GPU: %q", got)
	}
}

func TestRunNameTaken(t *testing.T) {
	e := newRunEnv(t)
	owner := e.detshare("run", "--name", "taken", "--", e.script(t, "taken", 0))
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.WriteFile(filepath.Join(e.dir, "taken.go"), []byte("1"), 0o644)
		owner.Wait()
	}()
	waitFile(t, filepath.Join(e.dir, "taken.pid"))
	marker := filepath.Join(e.dir, "ran")
	cmd := e.detshare("run", "--name", "taken", "--", "touch", marker)
	out, err := cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), "tenant already registered") {
		t.Errorf("second --name taken: exit %d %q", code, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CMD ran under a name already taken")
	}
	if _, ok := lookup(t, e.runDir, "taken"); !ok {
		t.Error("the refused run deregistered the first tenant")
	}
}

func TestRunFailsOpen(t *testing.T) {
	e := newRunEnv(t)
	blocker := filepath.Join(e.dir, "file")
	os.WriteFile(blocker, []byte("x"), 0o644)
	e.runDir = filepath.Join(blocker, "run") // cannot be created
	cmd := e.detshare("run", "--", "sh", "-c", `echo "preload=$LD_PRELOAD"; exit 3`)
	out, err := cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 3 || !strings.Contains(string(out), "preload=\n") ||
		!strings.Contains(string(out), "running CMD without it") {
		t.Errorf("fail-open: exit %d output %q", code, out)
	}
	cmd = e.detshare("run", "--strict", "--", "true")
	out, err = cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 {
		t.Errorf("--strict: exit %d output %q", code, out)
	}
}

// buildDir is DETSHARE_BUILD_DIR or the repository's build/.
func buildDir() string {
	if d := os.Getenv("DETSHARE_BUILD_DIR"); d != "" {
		return d
	}
	wd, _ := os.Getwd() // the package directory, cmd/detshare
	return filepath.Join(wd, "..", "..", "build")
}

// TestRunEndToEndWithLibdetshare runs real CUDA-client processes (the libdetshare probe) under `detshare run`
// with the real libdetshare on the simulated GPU (a test double): the quota reaches the library through the
// environment and the quota file, a joined process shares the tenant's memory budget, and the tenant's page
// accounts both processes.
func TestRunEndToEndWithLibdetshare(t *testing.T) {
	bd := buildDir()
	lib := filepath.Join(bd, "lib", "libdetshare.so")
	probe := filepath.Join(bd, "tests", "ds_probe_rt")
	sim := filepath.Join(bd, "lib", "simgpu")
	for _, f := range []string{lib, probe, filepath.Join(sim, "libcuda.so.1")} {
		if _, err := os.Stat(f); err != nil {
			if os.Getenv("DETSHARE_SKIP_E2E") == "1" {
				t.Skipf("DETSHARE_SKIP_E2E=1 and %s missing", f)
			}
			t.Fatalf("%s missing: run `make build` first (or set DETSHARE_SKIP_E2E=1)", f)
		}
	}
	e := newRunEnv(t)
	e.lib = lib
	withSim := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+sim, "DETSHARE_SIMGPU_STATE="+filepath.Join(e.dir, "simgpu.state"))
		return cmd
	}
	owner := withSim(e.detshare("run", "--tier", "burstable", "--sm", "16", "--memory", "1Gi", "--name", "e2e", "--",
		probe, "init", "total", "alloc:805306368", "hold"))
	stdin, _ := owner.StdinPipe()
	stdout, _ := owner.StdoutPipe()
	var stderr bytes.Buffer
	owner.Stderr = &stderr
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer owner.Process.Kill()
	var out strings.Builder
	buf := make([]byte, 4096)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "holding") && time.Now().Before(deadline) {
		n, err := stdout.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			break
		}
	}
	if !strings.Contains(out.String(), "total rc=0 bytes=1073741824") || !strings.Contains(out.String(), "alloc:805306368 rc=0") ||
		!strings.Contains(out.String(), "holding") {
		t.Fatalf("owner probe:\n%s\nstderr:\n%s", out.String(), stderr.String())
	}
	res, ok := lookup(t, e.runDir, "e2e")
	if !ok {
		t.Fatal("tenant e2e not registered")
	}
	cl, err := table.OpenClientPageReadOnly(res.Registration.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if cl.Page().MemUsed != 805306368 || cl.LiveProcesses() != 1 {
		t.Fatalf("client page: mem_used %d, live %d; want 768 MiB and 1 process", cl.Page().MemUsed, cl.LiveProcesses())
	}
	// A joined process shares the 1 GiB budget: 512 MiB more is refused, 256 MiB fits.
	join := withSim(e.detshare("run", "--join", "e2e", "--", probe, "init", "alloc:536870912", "alloc:268435456"))
	jout, err := join.CombinedOutput()
	if err != nil || !strings.Contains(string(jout), "alloc:536870912 rc=2") || !strings.Contains(string(jout), "alloc:268435456 rc=0") {
		t.Fatalf("joined probe: %v\n%s", err, jout)
	}
	if cl.Page().MemUsed != 805306368 || cl.LiveProcesses() != 1 {
		t.Errorf("after the joined process exited: mem_used %d, live %d", cl.Page().MemUsed, cl.LiveProcesses())
	}
	stdin.Close()
	if code := exitCode(t, owner, owner.Wait()); code != 0 {
		t.Errorf("owner exit %d; stderr:\n%s", code, stderr.String())
	}
	if _, ok := lookup(t, e.runDir, "e2e"); ok {
		t.Error("tenant still registered after its command exited")
	}
}

// A tenant that asks for a tier on a host without a GPU is refused (125) by default; nothing is left: no run
// directory, no scheduler (none started: the refusal comes before sched/ensure). Under [tenants] fail_open = true
// CMD runs without DetShare after a WARNING line on its stderr.
func TestRunWithTierOnHostWithoutGPUFollowsPolicyAndLeavesNothing(t *testing.T) {
	e := newRunEnv(t)
	noGPU := func(args ...string) *exec.Cmd {
		cmd := e.detshare(args...)
		cmd.Env = append(cmd.Env, "DETSHARE_SIMGPU=0", "DETSHARE_CONFIG="+filepath.Join(e.dir, "config.toml"),
			"DETSHARE_BIN="+filepath.Join(e.dir, "must-not-run"))
		return cmd
	}
	marker := filepath.Join(e.dir, "ran")
	cmd := noGPU("run", "--tier", "latency-critical", "--sm", "32", "--", "touch", marker)
	out, err := cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), "refused") ||
		!strings.Contains(string(out), "no GPU") || !strings.Contains(string(out), "fail_open") {
		t.Errorf("default policy: exit %d %q; want 125 naming the missing GPU and the fail_open key", code, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CMD ran although refused")
	}
	if _, err := os.Stat(e.runDir); err == nil {
		t.Error("run directory left behind by a refused tenant")
	}
	cmd = e.detshare("run", "--tier", "burstable", "--lib", filepath.Join(e.dir, "nope.so"), "--", "touch", marker)
	cmd.Env = append(cmd.Env, "DETSHARE_CONFIG="+filepath.Join(e.dir, "config.toml"))
	out, err = cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), "libdetshare.so not readable") {
		t.Errorf("library missing: exit %d %q; want 125 naming the library", code, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CMD ran although the library is missing")
	}
	os.WriteFile(filepath.Join(e.dir, "config.toml"), []byte("[tenants]\nfail_open = true\n"), 0o644)
	cmd = noGPU("run", "--tier", "latency-critical", "--", "sh", "-c", `echo "preload=$LD_PRELOAD"`)
	out, err = cmd.CombinedOutput()
	if code := exitCode(t, cmd, err); code != 0 || !strings.Contains(string(out), "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it") ||
		!strings.Contains(string(out), "preload=\n") {
		t.Errorf("fail_open: exit %d %q", code, out)
	}
	if _, err := os.Stat(e.runDir); err == nil {
		t.Error("run directory left behind under fail-open")
	}
}

// A misspelt DETSHARE_ variable in the environment `detshare run` passes on is refused like a bad value, alone or
// beside a valid flag, and CMD does not run.
func TestRunRefusesAMisspeltKey(t *testing.T) {
	e := newRunEnv(t)
	marker := filepath.Join(e.dir, "ran")
	for _, args := range [][]string{{"run"}, {"run", "--tier", "burstable"}} {
		cmd := e.detshare(append(args, "--", "touch", marker)...)
		cmd.Env = append(cmd.Env, "DETSHARE_TEIR=latency-critical")
		out, err := cmd.CombinedOutput()
		if code := exitCode(t, cmd, err); code != 125 || !strings.Contains(string(out), `DETSHARE_TEIR="latency-critical" (env): not a DetShare key (did you mean DETSHARE_TIER?)`) {
			t.Errorf("%v: exit %d, output %q", args, code, out)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CMD ran although a key was misspelt")
	}
}
