package containers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
	"github.com/detshare/detshare/shimv2"
)

const shimRuntime = "io.containerd.detshare.v1"

// killShimAndWaitDeregistered SIGKILLs the shim process (named shimName) serving container id and waits until the
// tenant is gone from the table: containerd's cleanup of a dead shim must deregister it.
func (e *env) killShimAndWaitDeregistered(t *testing.T, id, shimName string) {
	t.Helper()
	shim := 0
	for _, pid := range testenv.ProcessesNaming(id) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), shimName) {
			shim = pid
		}
	}
	if shim == 0 {
		t.Fatalf("%s of container %s not found", shimName, id)
	}
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, ok := e.lookup(t, id); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("still registered 20s after its shim was killed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (e *env) waitRegistered(t *testing.T, id string) table.Registration {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if r, ok := e.lookup(t, id); ok {
			return r
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never registered (table has %v)", id, e.registered(t))
	return table.Registration{}
}

// mountOptions returns the per-mount options of mount point mp from a mountinfo dump ("" when absent).
func mountOptions(mountinfo, mp string) string {
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == mp {
			return f[5]
		}
	}
	return ""
}

// checkInside runs the in-container assertions shared by ctr, Docker and CRI: the library works in an exec'd
// process (meminfo shows the quota), allocation over the quota fails, the quota file and the table are mounted
// read-only, the client page read-write.
func checkInside(t *testing.T, exec func(args ...string) (string, error), id string, memLimit uint64) {
	t.Helper()
	out, err := exec("simgpu-probe", "meminfo")
	if err != nil {
		t.Fatalf("exec meminfo: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != memLimit {
		t.Errorf("exec'd process sees %d bytes of GPU memory, want the quota %d (libdetshare not active in exec)", got, memLimit)
	}
	out, _ = exec("simgpu-probe", "alloc", "--size", fmt.Sprint(memLimit+(64<<20)))
	if !strings.Contains(out, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("allocation over the quota not refused:\n%s", out)
	}
	mi, err := exec("cat", "/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("exec cat mountinfo: %v: %s", err, mi)
	}
	for mp, want := range map[string]string{table.ContainerQuotaPath: "ro", table.ContainerTablePath: "ro",
		table.ContainerLibPath: "ro", table.ContainerLdPreloadPath: "ro", table.ContainerClientPagePath: "rw"} {
		opts := mountOptions(mi, mp)
		if !strings.HasPrefix(opts, want+",") && opts != want {
			t.Errorf("%s mounted with %q, want %s", mp, opts, want)
		}
	}
	if out, err := exec("sh", "-c", "echo x > "+table.ContainerQuotaPath); err == nil {
		t.Errorf("quota file writable from the container: %s", out)
	}
	q, err := exec("cat", table.ContainerQuotaPath)
	if err != nil || !strings.Contains(q, "id="+id+"\n") || !strings.Contains(q, "table="+table.ContainerTablePath) {
		t.Errorf("quota file in the container: %v\n%s", err, q)
	}
}

func TestCtrRunEnvLabelExecAndKill(t *testing.T) {
	e := need(t)
	id := "ds-ctr-env"
	out, err := e.ctr("run", "-d", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=burstable",
		"--env", "DETSHARE_MEMORY=1GiB", "--env", "DETSHARE_SMS=16", "--label", "detshare.io/weight=3",
		imageRef, id, "sh", "-c", "simgpu-probe meminfo > /tmp/main.out 2>&1; exec sleep 300")
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	defer e.ctr("containers", "rm", id)
	r := e.waitRegistered(t, id)
	if r.MemLimit != 1<<30 || r.SMs < 16 || r.Weight != 3 || r.Tier != table.TierBurstable {
		// ctr 1.6 puts --label into the container's labels and its spec's annotations; TestShimReadsContainerdLabels
		// checks the label lookup on its own.
		t.Errorf("registration %+v: want burstable, >=16 SMs, 1 GiB (env), weight 3 (--label)", r)
	}
	if !ensure.LeaderRunning(e.runDir) {
		t.Error("the shim did not start the host scheduler on demand (sched/ensure)")
	}
	exec := func(args ...string) (string, error) {
		return e.ctr(append([]string{"tasks", "exec", "--exec-id", fmt.Sprintf("x%d", time.Now().UnixNano()), id}, args...)...)
	}
	checkInside(t, exec, id, 1<<30)
	var main string
	for i := 0; i < 50; i++ {
		if main, _ = exec("cat", "/tmp/main.out"); strings.Contains(main, "meminfo") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := meminfoTotal(t, main); got != 1<<30 {
		t.Errorf("main process sees %d bytes, want the quota", got)
	}
	if out, err := e.ctr("tasks", "kill", "-s", "SIGKILL", id); err != nil {
		t.Fatalf("kill: %v: %s", err, out)
	}
	for i := 0; i < 100; i++ {
		if out, _ := e.ctr("tasks", "ls"); !strings.Contains(out, "RUNNING") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := e.ctr("tasks", "rm", id); err != nil {
		t.Fatalf("tasks rm: %v: %s", err, out)
	}
	if out, err := e.ctr("containers", "rm", id); err != nil {
		t.Fatalf("containers rm: %v: %s", err, out)
	}
	e.assertNoLeak(t, id)
}

func TestCtrRunAnnotationsDeregisterOnExit(t *testing.T) {
	e := need(t)
	id := "ds-ctr-ann"
	out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, "--annotation", "detshare.io/tier=latency-critical",
		"--annotation", "detshare.io/sms=16", "--annotation", "detshare.io/memory=512MiB",
		"--env", "DETSHARE_TIER=best-effort", // annotations win over env
		imageRef, id, "sh", "-c", "simgpu-probe meminfo; "+testenv.OwnTierScript())
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != 512<<20 {
		t.Errorf("main process sees %d bytes, want 512 MiB", got)
	}
	if !strings.Contains(out, testenv.TierLine(table.TierLatencyCritical)) {
		t.Errorf("the container's table slot is not latency-critical (annotation over env):\n%s", out)
	}
	e.assertNoLeak(t, id)
}

// A tenant cannot switch its quota off from its own environment (issue 13 item 2): with
// DETSHARE_QUOTA_FILE=/nonexistent the library still reads the read-only quota file the hook mounted.
func TestCtrEnvCannotSwitchOffQuota(t *testing.T) {
	e := need(t)
	id := "ds-ctr-envoff"
	out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, "--annotation", "detshare.io/memory=512MiB",
		"--env", "DETSHARE_QUOTA_FILE=/nonexistent", imageRef, id, "sh", "-c", "simgpu-probe meminfo")
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != 512<<20 {
		t.Errorf("with DETSHARE_QUOTA_FILE=/nonexistent the container sees %d bytes, want its 512 MiB quota", got)
	}
	e.assertNoLeak(t, id)
}

func TestCtrPlainContainerRunsAsUnderRunc(t *testing.T) {
	e := need(t)
	id := "ds-ctr-plain"
	out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, imageRef, id, "sh", "-c",
		"simgpu-probe meminfo; test -e /run/detshare/quota && echo MOUNTED || echo NOT-MOUNTED; cat /etc/ld.so.preload 2>/dev/null; echo END")
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != simTotal {
		t.Errorf("plain container sees %d bytes, want the whole simulated GPU %d", got, uint64(simTotal))
	}
	if !strings.Contains(out, "NOT-MOUNTED") || strings.Contains(out, "libdetshare") {
		t.Errorf("plain container got DetShare mounts:\n%s", out)
	}
	for _, r := range e.registered(t) {
		if r == id {
			t.Error("plain container registered")
		}
	}
	e.assertNoLeak(t, id)
}

func TestCtrBadQuotaRefusedAndNothingLeaks(t *testing.T) {
	e := need(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown tier", []string{"--env", "DETSHARE_TIER=gold"}, []string{`DETSHARE_TIER="gold"`, "latency-critical"}},
		{"200% SMs", []string{"--annotation", "detshare.io/tier=burstable", "--annotation", "detshare.io/sms=200%"},
			[]string{`detshare.io/sms="200%"`}},
		{"memory over GPU", []string{"--label", "detshare.io/tier=burstable", "--label", "detshare.io/memory=100GiB"},
			[]string{`detshare.io/memory="100GiB"`, "more than GPU"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("ds-ctr-bad%d", i)
			args := append([]string{"run", "--rm", "--runtime", shimRuntime}, c.args...)
			out, err := e.ctr(append(args, imageRef, id, "true")...)
			if err == nil {
				t.Fatalf("ctr run succeeded with a bad quota: %s", out)
			}
			t.Logf("refusal as the user sees it: %s", strings.TrimSpace(out))
			out = strings.ReplaceAll(out, shimv2.FullwidthPercent, "%") // containerd 1.6 (see shimv2.invalidArgument)
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("error does not name %s:\n%s", w, out)
				}
			}
			e.assertNoLeak(t, id)
			if ls, _ := e.ctr("containers", "ls", "-q"); strings.Contains(ls, id) {
				t.Errorf("half-created container %s left", id)
				e.ctr("containers", "rm", id)
			}
		})
	}
	t.Run("admission refused", func(t *testing.T) {
		t.Setenv("DETSHARE_SIMGPU", "1")
		ctx := context.Background()
		if _, err := registrar.Register(ctx, e.runDir, tenant.Request{ID: "blocker",
			Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "90%"}}.Resolve()}); err != nil {
			t.Fatalf("register blocker: %v", err)
		}
		defer tenant.Deregister(e.runDir, "blocker")
		id := "ds-ctr-refused"
		out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=burstable",
			"--env", "DETSHARE_SMS=50%", imageRef, id, "true")
		if err == nil {
			t.Fatalf("admitted beside a 90%% latency-critical tenant: %s", out)
		}
		if !strings.Contains(out, "admission refused") || !strings.Contains(out, "blocker") {
			t.Errorf("refusal does not say why:\n%s", out)
		}
		e.assertNoLeak(t, id)
	})
}

// A shim that dies is cleaned up by containerd running the shim binary's `delete` action (the front,
// shimv2/front.Delete), which deregisters the container: no slot, mount or process is left. The process killed is
// the serving shim the front started (containerd-shim-detshare-v1-serve), and containerd's log carries the front's
// report of the deregistration (the delete action's stderr, "cleanup warnings").
func TestCtrShimKilledDeregisters(t *testing.T) {
	e := need(t)
	id := "ds-ctr-shimkill"
	out, err := e.ctr("run", "-d", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=best-effort", imageRef, id, "sleep", "300")
	if err != nil {
		t.Fatalf("ctr run: %v: %s", err, out)
	}
	defer e.ctr("containers", "rm", id)
	e.waitRegistered(t, id)
	serving := 0
	for _, pid := range testenv.ProcessesNaming(id) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if argv0, _, _ := strings.Cut(string(cmd), "\x00"); strings.HasPrefix(filepath.Base(argv0), "containerd-shim-detshare") {
			if filepath.Base(argv0) != "containerd-shim-detshare-v1-serve" {
				t.Errorf("shim process %d of %s runs %s, want the serving shim containerd-shim-detshare-v1-serve", pid, id, argv0)
			}
			serving++
		}
	}
	if serving != 1 {
		t.Fatalf("%d shim processes name %s, want the one serving shim (the front's start exits)", serving, id)
	}
	e.killShimAndWaitDeregistered(t, id, "containerd-shim-detshare-v1-serve")
	if log, _ := os.ReadFile(filepath.Join(e.dir, "containerd.log")); !regexp.MustCompile(`deregistered from DetShare at shim delete[^\n]*id=` + id).Match(log) {
		t.Errorf("containerd's log has no deregistration by the front's delete action for %s", id)
	}
	e.ctr("tasks", "rm", "-f", id)
	if out, err := e.ctr("containers", "rm", id); err != nil {
		t.Fatalf("containers rm: %v: %s", err, out)
	}
	e.assertNoLeak(t, id)
}

// ctr 1.6 copies --label into the spec's annotations as well, so TestCtrRunEnvLabelExecAndKill cannot tell the
// shim's label lookup from annotations; this checks the lookup itself against the real containerd.
func TestShimReadsContainerdLabels(t *testing.T) {
	e := need(t)
	id := "ds-ctr-labels"
	if out, err := e.ctr("containers", "create", "--label", "detshare.io/tier=burstable", "--label", "other=x", imageRef, id, "true"); err != nil {
		t.Fatalf("ctr containers create: %v: %s", err, out)
	}
	defer e.ctr("containers", "rm", id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	labels, err := shimv2.ContainerdLabels(e.ctrSock, ctrNS)(ctx, id)
	if err != nil || labels["detshare.io/tier"] != "burstable" || labels["other"] != "x" {
		t.Fatalf("labels = %v, %v", labels, err)
	}
	if _, err := shimv2.ContainerdLabels(e.ctrSock, ctrNS)(ctx, "no-such-container"); err == nil {
		t.Error("a missing container gave no error")
	}
}
