package containers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
	"github.com/detshare/detshare/sched/mps"
)

// TestContainerAttacksOnSharedFiles plays issue 13 items 1 and 7 from inside a plain runc container (standalone
// hook, root in the container, simulated GPU and simulated MPS: test doubles): the container
//   - drops to nobody and runs a CUDA client: it must keep its quota (640 MiB, not the whole simulated GPU);
//   - tries to delete and create files in the MPS pipe directory: refused (read-only mount), so the daemon every
//     tenant of the GPU uses is not restarted;
//   - truncates the doorbell and its own client page: the scheduler survives, stays leader and repairs the doorbell.
func TestContainerAttacksOnSharedFiles(t *testing.T) {
	e := need(t)
	id := "ds-trust"
	t.Setenv(ensure.BinEnv, filepath.Join(e.bin, "detshare"))
	t.Setenv("DETSHARE_SIMGPU", "1")
	if err := ensure.EnsureScheduler(e.runDir); err != nil {
		t.Fatalf("start the scheduler: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tb, err := table.OpenReadOnly(e.runDir)
	for err != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		tb, err = table.OpenReadOnly(e.runDir)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	for len(tb.GPUs()) == 0 || tb.GPUs()[0].MPSPipeDir == "" || !tb.LeaderAlive(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("scheduler did not start simulated MPS: %+v", tb.GPUs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	leader := tb.Leader().PID
	pipeDir := tb.GPUs()[0].MPSPipeDir
	script := strings.Join([]string{
		`busybox su -p -s /bin/sh nobody -c "busybox id -u; simgpu-probe meminfo"`,
		`busybox rm -f /run/detshare/mps/control && echo MPS-DELETED`,
		`busybox touch /run/detshare/mps/x && echo MPS-WRITABLE`,
		`busybox truncate -s 0 /run/detshare/doorbell && echo BELL-TRUNCATED`,
		`busybox truncate -s 0 /run/detshare/client.page && echo PAGE-TRUNCATED`,
		`busybox sleep 1`,
		`simgpu-probe meminfo >/dev/null; echo PROBE-AFTER=$?`,
		`cat /proc/self/mountinfo`,
	}, "; ")
	// CAP_SETUID/CAP_SETGID, as Docker and containerd give a container by default (runc spec's default lacks them).
	withSetID := func(spec map[string]any) {
		caps := spec["process"].(map[string]any)["capabilities"].(map[string]any)
		for _, set := range []string{"bounding", "effective", "permitted"} {
			l, _ := caps[set].([]any)
			caps[set] = append(l, "CAP_SETUID", "CAP_SETGID")
		}
	}
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable", "DETSHARE_MEMORY=640MiB"}, script, withSetID)
	if err := os.MkdirAll(filepath.Join(b, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(b, "rootfs", "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(e.dir, "runc-root")
	out, err := run(60*time.Second, nil, "runc", "--root", root, "run", "--bundle", b, id)
	if err != nil {
		t.Fatalf("runc run: %v: %s", err, out)
	}
	if !strings.Contains(out, "\n65534\n") && !strings.HasPrefix(out, "65534\n") {
		t.Errorf("the privilege drop did not happen:\n%s", out)
	}
	if got := meminfoTotal(t, out); got != 640<<20 {
		t.Errorf("after dropping to nobody the container sees %d bytes, want its 640 MiB quota:\n%s", got, out)
	}
	if strings.Contains(out, "MPS-DELETED") || strings.Contains(out, "MPS-WRITABLE") {
		t.Errorf("the container changed the MPS pipe directory:\n%s", out)
	}
	if opts := mountOptions(out, table.ContainerMPSPipeDir); !strings.HasPrefix(opts, "ro") {
		t.Errorf("MPS pipe directory mounted %q, want ro", opts)
	}
	if _, err := os.Stat(filepath.Join(pipeDir, mps.SimControlFile)); err != nil {
		t.Errorf("MPS control file gone on the host: %v", err)
	}
	if !strings.Contains(out, "BELL-TRUNCATED") || !strings.Contains(out, "PAGE-TRUNCATED") {
		t.Fatalf("the truncations did not happen (the test must exercise them):\n%s", out)
	}
	if !strings.Contains(out, "PROBE-AFTER=0") {
		t.Errorf("a CUDA client after the truncation failed:\n%s", out)
	}
	if err := syscall.Kill(leader, 0); err != nil || tb.Leader().PID != leader || !tb.LeaderAlive(2*time.Second) {
		t.Fatalf("scheduler %d did not survive the truncations: %v, leader now %+v", leader, err, tb.Leader())
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		st, err := os.Stat(table.NewPaths(e.runDir).Doorbell())
		if err == nil && st.Size() == table.DoorbellSize {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("doorbell not repaired: %v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.assertNoLeak(t, id)
}

// TestContainerDamagedPageFailsClosed is issue 27's "a tenant switches DetShare off for its own later processes with
// 8 bytes", from inside a plain runc container (standalone hook, simulated GPU and MPS: test doubles): root in the
// container keeps overwriting the magic of its client page while it starts CUDA clients. Before the fix such a client
// ran with no quota (the whole simulated GPU). Now each client either runs no CUDA work and says why, or (started in
// the instant after a repair) sees its 640 MiB quota; never more. Once the container stops damaging the page, the
// scheduler's housekeeping repairs it and a client sees its quota again.
func TestContainerDamagedPageFailsClosed(t *testing.T) {
	e := need(t)
	id := "ds-failclosed"
	t.Setenv(ensure.BinEnv, filepath.Join(e.bin, "detshare"))
	t.Setenv("DETSHARE_SIMGPU", "1")
	if err := ensure.EnsureScheduler(e.runDir); err != nil {
		t.Fatalf("start the scheduler: %v", err)
	}
	script := strings.Join([]string{
		`(while :; do printf 'garbage!' | busybox dd of=/run/detshare/client.page bs=8 count=1 conv=notrunc 2>/dev/null; done) &`,
		`D=$!`,
		`busybox sleep 0.3`,
		`for i in 1 2 3; do simgpu-probe meminfo >/tmp/try 2>&1; echo "TRY$i-EXIT=$?"; busybox sed "s/^/TRY$i /" /tmp/try; done`,
		`kill $D`,
		`busybox sleep 1.5`,
		`simgpu-probe meminfo; echo AFTER=$?`,
	}, "\n")
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable", "DETSHARE_MEMORY=640MiB"}, script)
	out, err := run(60*time.Second, nil, "runc", "--root", filepath.Join(e.dir, "runc-root"), "run", "--bundle", b, id)
	if err != nil {
		t.Fatalf("runc run: %v: %s", err, out)
	}
	refused := 0
	for i := 1; i <= 3; i++ {
		p := fmt.Sprintf("TRY%d ", i)
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			if s, ok := strings.CutPrefix(l, p); ok {
				lines = append(lines, s)
			}
		}
		try := strings.Join(lines, "\n")
		switch {
		case strings.Contains(try, "refuses this process's CUDA work"):
			refused++
			if strings.Contains(out, fmt.Sprintf("TRY%d-EXIT=0", i)) {
				t.Errorf("try %d: refused, yet exited 0:\n%s", i, try)
			}
		case strings.Contains(try, `"cmd":"meminfo"`):
			if got := meminfoTotal(t, try); got != 640<<20 {
				t.Errorf("try %d ran on a damaged page with %d bytes, want its 640 MiB quota or a refusal:\n%s", i, got, try)
			}
		default:
			t.Errorf("try %d neither refused nor ran:\n%s", i, try)
		}
	}
	if refused == 0 {
		t.Errorf("no client started on the damaged page was refused:\n%s", out)
	}
	if !strings.Contains(out, "AFTER=0") {
		t.Fatalf("a client after the repair failed:\n%s", out)
	}
	last := out[strings.LastIndex(out, "TRY3"):]
	if got := meminfoTotal(t, last); got != 640<<20 {
		t.Errorf("after the repair the client sees %d bytes, want 640 MiB:\n%s", got, last)
	}
	e.assertNoLeak(t, id)
}

// TestContainerPageGrowthRefusedByKernel is issue 27's page size bound through the standalone hook and runc: with
// the table asking for client pages on a tmpfs of their own (tenants.page_mounts, as the scheduler sets it for
// /run/detshare), root in a container writes 16 MiB past the end of /run/detshare/client.page as fast as dd can. The
// kernel refuses it (ENOSPC) and the page holds no more memory than its own tmpfs; a CUDA client still sees its quota;
// when the container is gone nothing of it stays mounted or registered. Before, the 16 MiB landed in the run
// directory's filesystem (until the next housekeeping round).
func TestContainerPageGrowthRefusedByKernel(t *testing.T) {
	e := need(t)
	id := "ds-pagebound"
	t.Setenv(ensure.BinEnv, filepath.Join(e.bin, "detshare"))
	t.Setenv("DETSHARE_SIMGPU", "1")
	if err := ensure.EnsureScheduler(e.runDir); err != nil {
		t.Fatalf("start the scheduler: %v", err)
	}
	tb, err := table.Create(e.runDir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	// The scheduler records its own decision (auto: off for this run directory) as it takes the lead, after the lock
	// that EnsureScheduler waits for: set it on once the leader is in the table.
	for deadline := time.Now().Add(10 * time.Second); !tb.LeaderAlive(5 * time.Second); {
		if time.Now().After(deadline) {
			t.Fatal("no scheduler leads the table")
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.SetPageMounts(true)
	defer tb.SetPageMounts(false)
	script := strings.Join([]string{
		`busybox dd if=/dev/zero of=/run/detshare/client.page bs=1048576 seek=1 count=16 conv=notrunc 2>&1; echo DD=$?`,
		`echo ALLOCATED=$(busybox stat -c '%b*%B' /run/detshare/client.page)`,
		`simgpu-probe meminfo; echo PROBE=$?`,
	}, "\n")
	b := e.standaloneBundle(t, []string{"DETSHARE_TIER=burstable", "DETSHARE_MEMORY=640MiB"}, script)
	out, err := run(60*time.Second, nil, "runc", "--root", filepath.Join(e.dir, "runc-root"), "run", "--bundle", b, id)
	if err != nil {
		t.Fatalf("runc run: %v: %s", err, out)
	}
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "DD=0") {
		t.Errorf("16 MiB written past the client page's end inside the container were not refused:\n%s", out)
	}
	// The memory the page holds once written past: its size rounded up, not the 16 MiB.
	var blocks, bsize int64
	if i := strings.Index(out, "ALLOCATED="); i < 0 {
		t.Errorf("no ALLOCATED line:\n%s", out)
	} else if _, err := fmt.Sscanf(out[i:], "ALLOCATED=%d*%d", &blocks, &bsize); err != nil || blocks*bsize > 64<<10 {
		t.Errorf("the client page holds %d bytes after the write (%v), want at most its tmpfs (12 KiB):\n%s",
			blocks*bsize, err, out)
	}
	if !strings.Contains(out, "PROBE=0") || meminfoTotal(t, out) != 640<<20 {
		t.Errorf("the CUDA client did not see its 640 MiB quota on the bounded page:\n%s", out)
	}
	e.assertNoLeak(t, id)
}
