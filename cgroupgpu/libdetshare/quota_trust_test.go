package libdetshare_test

// Attacks of a hostile tenant on its own memory quota (issue 13 items 2 and 3, docs/threat-model-quota.md): each test
// reproduces one and asserts that the quota still holds.

import (
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// In a container the hook mounts the quota file read-only at /run/detshare/quota. A tenant setting
// DETSHARE_QUOTA_FILE=/nonexistent (or to a file of its own) must not switch DetShare off: the fixed path wins.
// The test builds that container view with a private mount namespace (tmpfs over /run, the quota file bind-mounted
// read-only at the fixed path), so nothing of the host's /run is touched.
func TestEnvCannotOverrideContainerQuotaFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (private mount namespace for the container view of /run/detshare)")
	}
	for _, override := range []string{"/nonexistent", ""} {
		t.Run("DETSHARE_QUOTA_FILE="+override, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			var vars []string
			for _, v := range e.vars {
				if !strings.HasPrefix(v, "DETSHARE_QUOTA_FILE=") {
					vars = append(vars, v)
				}
			}
			if override != "" {
				// the tenant's own quota file: unlimited, pointing at the same slot
				forged := e.quotaFile + ".forged"
				data, err := os.ReadFile(e.quotaFile)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(forged, []byte(strings.ReplaceAll(string(data), "memory=67108864", "memory=0")), 0o644); err != nil {
					t.Fatal(err)
				}
				vars = append(vars, "DETSHARE_QUOTA_FILE="+override)
			}
			script := `set -e
mount -t tmpfs detshare-test /run
mkdir -p /run/detshare
touch /run/detshare/quota
mount --bind -o ro "$QF" /run/detshare/quota
mount -o remount,bind,ro /run/detshare/quota
exec "$PROBE" init alloc:50331648 alloc:33554432 info`
			cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
			cmd.Env = append(vars, "QF="+e.quotaFile, "PROBE="+need(t, "tests/ds_probe_rt"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("probe in the container view: %v\n%s", err, out)
			}
			r := parse(string(out))
			if r.get(t, "alloc:50331648", "rc") != "0" {
				t.Fatalf("48 MiB within the quota refused:\n%s", out)
			}
			if rc := r.get(t, "alloc:33554432", "rc"); rc != "2" {
				t.Fatalf("32 MiB past the 64 MiB quota returned %s, want 2 (quota switched off by the tenant's "+
					"environment):\n%s", rc, out)
			}
			if _, total := r.infos(t); total[0] != 64*MiB {
				t.Fatalf("cuMemGetInfo total = %d, want the quota %d", total[0], 64*MiB)
			}
		})
	}
}

// A CUDA_MPS_PINNED_DEVICE_MEM_LIMIT the tenant set itself (a client may raise a limit it sets) is replaced by the
// host's limit before the driver initialises.
func TestTenantMPSLimitVariableReplaced(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, t.TempDir())
	e.vars = append(e.vars, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G")
	r := e.run("ds_probe_rt", "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
	if v := r.get(t, "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value"); v != "0=64M" {
		t.Fatalf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = %q, want the host's 0=64M", v)
	}
}

// Writing mem_used=0 into the client page (the tenant can write its page) does not let a process allocate past the
// quota through the library: each process also counts what it holds in its own memory.
func TestZeroedClientPageDoesNotRaiseTheQuota(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			cmd := exec.Command(need(t, "tests/"+prog), "init", "alloc:50331648", "hold", "alloc:33554432",
				"alloc:8388608", "info")
			cmd.Env = e.vars
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			pr, pw, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout, cmd.Stderr = pw, pw
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			buf := make([]byte, 4096)
			for !strings.Contains(out.String(), "holding") {
				n, err := pr.Read(buf)
				if err != nil {
					t.Fatalf("probe ended before holding: %v\n%s", err, out.String())
				}
				out.Write(buf[:n])
			}
			if used := e.memUsed(); used != 48*MiB {
				t.Fatalf("page mem_used = %d before the forgery, want %d", used, 48*MiB)
			}
			// the forgery: the tenant's total and every process entry say nothing is used
			pg := e.client.Page()
			atomic.StoreUint64(&pg.MemUsed, 0)
			for i := range pg.Procs {
				atomic.StoreUint64(&pg.Procs[i].MemUsed, 0)
			}
			stdin.Close()
			for {
				n, err := pr.Read(buf)
				out.Write(buf[:n])
				if err != nil {
					break
				}
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("probe: %v\n%s", err, out.String())
			}
			r := parse(out.String())
			if rc := r.get(t, "alloc:33554432", "rc"); rc != "2" {
				t.Fatalf("32 MiB on top of 48 MiB held, after the page was zeroed, returned %s; want 2:\n%s", rc,
					out.String())
			}
			if rc := r.get(t, "alloc:8388608", "rc"); rc != "0" {
				t.Fatalf("8 MiB within the process's own room refused (%s):\n%s", rc, out.String())
			}
		})
	}
}

// A graph memory-allocation node takes device memory the driver keeps for the graph: it is charged when the node is
// added and refused past the quota (without DetShare it escaped it entirely).
func TestGraphMemoryNodeCharged(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			r := e.run(prog, "init", "graphmem:33554432", "info", "graphmem:67108864", "graphnode:16777216", "info",
				"graphnode:33554432")
			if rc := r.get(t, "graphmem:33554432", "rc"); rc != "0" {
				t.Fatalf("32 MiB graph memory node within the quota: rc %s\n%v", rc, r.lines)
			}
			if rc := r.get(t, "graphmem:67108864", "rc"); rc != "2" {
				t.Fatalf("64 MiB graph memory node past the quota: rc %s, want 2\n%v", rc, r.lines)
			}
			if rc := r.get(t, "graphnode:33554432", "rc"); rc != "2" {
				t.Fatalf("32 MiB node through cuGraphAddNode past the quota: rc %s, want 2\n%v", rc, r.lines)
			}
			free, _ := r.infos(t)
			if free[0] != 32*MiB || free[1] != 16*MiB {
				t.Fatalf("free after the graph memory nodes (cuGraphAddMemAllocNode, then cuGraphAddNode) = %v, "+
					"want [32 MiB 16 MiB]", free)
			}
		})
	}
}

// Every executable of a graph may hold its memory nodes' memory: the second and later instantiations are charged
// again and refused past the quota (the first is covered by the node's own charge).
func TestGraphMemoryChargedPerExecutable(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			r := e.run(prog, "init", "graphmem:16777216", "graphinst", "info", "graphinst", "info", "graphinst",
				"graphinst", "info", "graphinst", "info")
			var rcs []string
			for _, l := range r.order {
				if l.step == "graphinst" {
					rcs = append(rcs, l.kv["rc"])
				}
			}
			if strings.Join(rcs, ",") != "0,0,0,0,2" {
				t.Fatalf("instantiations of a graph with a 16 MiB node in a 64 MiB quota returned %v, want 0,0,0,0,2\n%v",
					rcs, r.lines)
			}
			free, _ := r.infos(t)
			want := []uint64{48 * MiB, 32 * MiB, 0, 0}
			for i := range want {
				if free[i] != want[i] {
					t.Fatalf("free after each instantiation = %v, want %v", free, want)
				}
			}
		})
	}
}

// A pool's release threshold (memory kept after frees) is a reservation charged against the quota; one that does
// not fit is lowered to 0 for the driver, so the pool keeps nothing unseen; destroying the pool credits it.
func TestPoolReleaseThresholdCharged(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			r := e.run(prog, "init", "poolthreshold:16777216", "info", "poolthreshold:8388608", "info",
				"poolthreshold:18446744073709551615", "info", "poolthreshold:4194304", "pooldestroy", "info")
			if r.get(t, "poolthreshold:16777216", "rc") != "0" || r.num(t, "poolthreshold:16777216", "threshold") != 16*MiB {
				t.Fatalf("16 MiB threshold: %v", r.lines)
			}
			if got := r.num(t, "poolthreshold:18446744073709551615", "threshold"); got != 0 {
				t.Fatalf("a threshold past the quota reached the driver as %d, want 0", got)
			}
			if r.get(t, "poolthreshold:18446744073709551615", "rc") != "0" {
				t.Fatalf("an unlimited threshold must not fail the application: %v", r.lines)
			}
			free, _ := r.infos(t)
			want := []uint64{48 * MiB, 56 * MiB, 64 * MiB, 64 * MiB}
			for i := range want {
				if free[i] != want[i] {
					t.Fatalf("free after each threshold = %v, want %v", free, want)
				}
			}
			if used := e.memUsed(); used != 0 {
				t.Fatalf("page mem_used = %d after exit, want 0", used)
			}
		})
	}
}

// A process that bypasses the library (cuMemAlloc_v2 resolved straight from libcuda's symbol table, or no library
// at all) is outside DetShare's accounting; under MPS the backstop is the server-side per-client limit the scheduler
// sets (sched/mps SetClientMemLimit), which a client cannot raise with its own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
// Simulated MPS and GPU (test doubles) model that limit per process.
func TestBypassCaughtByMPSServerLimit(t *testing.T) {
	e := newEnv(t, true)
	m := &mps.Manager{Paths: table.NewPaths(e.runDir), Simulated: true}
	d, err := m.Start(0, "SIM-0")
	if err != nil {
		t.Fatal(err)
	}
	e.withTenant(64*MiB, d.PipeDir)
	e.vars = append(e.vars, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G")

	// the escape without a server-side limit: a process without the library raises its own client limit
	bare := newEnv(t, false)
	bare.vars = append(bare.vars, "CUDA_MPS_PIPE_DIRECTORY="+d.PipeDir, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G")
	if rc := bare.run("ds_probe_rt", "init", "alloc:104857600").get(t, "alloc:104857600", "rc"); rc != "0" {
		t.Fatalf("control: without a server-side limit 100 MiB should be allowed, rc %s", rc)
	}

	if err := m.SetClientMemLimit(d, 64*MiB, simMem); err != nil {
		t.Fatal(err)
	}
	if rc := bare.run("ds_probe_rt", "init", "alloc:104857600").get(t, "alloc:104857600", "rc"); rc != "2" {
		t.Fatalf("no library, own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100G: 100 MiB past the server-side 64 MiB "+
			"returned %s, want 2", rc)
	}
	r := e.run("ds_probe_rt", "init", "rawalloc:104857600", "rawalloc:33554432")
	if obj := r.get(t, "rawalloc:104857600", "obj"); obj != "libcuda.so.1" {
		t.Fatalf("the bypass did not reach the driver directly (%s)", obj)
	}
	if rc := r.get(t, "rawalloc:104857600", "rc"); rc != "2" {
		t.Fatalf("bypass of the library: 100 MiB past the server-side limit returned %s, want 2", rc)
	}
	if rc := r.get(t, "rawalloc:33554432", "rc"); rc != "0" {
		t.Fatalf("bypass within the limit: rc %s", rc)
	}
	// what the bypass took is invisible to the library's accounting (docs/threat-model-quota.md says so)
	if used := e.memUsed(); used != 0 {
		t.Fatalf("page mem_used = %d: the library saw a call it was not supposed to see", used)
	}
}

// The MPS client priority follows the tier the host registered, not the tenant's environment: every lower tier is
// below normal, so that SMs a latency-critical tenant's grant shares with it go to the latency-critical blocks
// first (issue 12); a value the tenant set is replaced before the driver initialises.
func TestMPSClientPriorityFollowsTier(t *testing.T) {
	for _, c := range []struct {
		name      string
		tier      table.Tier
		tenantVar string
		want      string
	}{
		{"best-effort", table.TierBestEffort, "", "1"},
		{"best-effort asks for normal", table.TierBestEffort, "CUDA_MPS_CLIENT_PRIORITY=0", "1"},
		{"burstable", table.TierBurstable, "", "1"},
		{"latency-critical", table.TierLatencyCritical, "CUDA_MPS_CLIENT_PRIORITY=1", "0"},
		{"switched off", table.TierBestEffort, "DETSHARE_MPS_PRIORITY=off", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, true).withTenant(0, t.TempDir())
			atomic.StoreUint32(&e.tbl.Container(e.reg.Slot).Tier, uint32(c.tier))
			if c.tenantVar != "" {
				e.vars = append(e.vars, c.tenantVar)
			}
			r := e.run("ds_probe_rt", "env:CUDA_MPS_CLIENT_PRIORITY")
			if v := r.get(t, "env:CUDA_MPS_CLIENT_PRIORITY", "value"); v != c.want {
				t.Fatalf("CUDA_MPS_CLIENT_PRIORITY = %q, want %q", v, c.want)
			}
		})
	}
}

// zeroMemUsed is the forgery of issue 27: the tenant's total and every process entry say nothing is used.
func zeroMemUsed(e *env) {
	pg := e.client.Page()
	atomic.StoreUint64(&pg.MemUsed, 0)
	for i := range pg.Procs {
		atomic.StoreUint64(&pg.Procs[i].MemUsed, 0)
	}
}

// TestZeroedClientPageDoesNotRaiseTheQuotaAcrossProcesses is issue 27's "zeroing mem_used lets N processes hold
// N x quota": with one process holding 48 MiB of a 64 MiB tenant and the page zeroed, other processes of the tenant
// must still get only the 16 MiB left, together. Before the fix each new process saw an empty page and its own
// empty tally and took a whole quota (4 processes held 4 x 64 MiB). The tenant's memory ledger (kernel locks on the
// page) is what no page write can reset; a process that exits gives its share back by itself.
func TestZeroedClientPageDoesNotRaiseTheQuotaAcrossProcesses(t *testing.T) {
	for i, prog := range probes {
		other := probes[1-i]
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			a := e.startHolder(prog, "init", "alloc:50331648") // 48 MiB
			zeroMemUsed(e)
			r := e.run(other, "init", "alloc:33554432", "alloc:16777216", "alloc:1048576")
			if rc := r.get(t, "alloc:33554432", "rc"); rc != "2" {
				t.Errorf("32 MiB beside 48 MiB held in a 64 MiB tenant, page zeroed: rc %s, want 2\n%s", rc,
					strings.Join(r.lines, "\n"))
			}
			if rc := r.get(t, "alloc:16777216", "rc"); rc != "0" {
				t.Errorf("the 16 MiB left refused: rc %s\n%s", rc, strings.Join(r.lines, "\n"))
			}
			if rc := r.get(t, "alloc:1048576", "rc"); rc != "2" {
				t.Errorf("1 MiB past the quota: rc %s, want 2\n%s", rc, strings.Join(r.lines, "\n"))
			}
			// Four more processes, each asking for 8 MiB, the page zeroed again: together they get the 16 MiB left.
			zeroMemUsed(e)
			ok := 0
			var ps []*stepper
			for k := 0; k < 4; k++ {
				p := e.start(other, "init", "alloc:8388608", "pause")
				ps = append(ps, p)
				if p.until().get(t, "alloc:8388608", "rc") == "0" {
					ok++
				}
				zeroMemUsed(e)
			}
			if ok != 2 {
				t.Errorf("%d of 4 processes got 8 MiB with 16 MiB left and the page zeroed before each; want 2", ok)
			}
			for _, p := range ps { // killed: the kernel gives their share back
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
			a.release(t)
			// the holder gone, its share is back: a new process gets the whole quota
			r = e.run(other, "init", "alloc:67108864")
			if rc := r.get(t, "alloc:67108864", "rc"); rc != "0" {
				t.Errorf("after the holder exited, the whole 64 MiB: rc %s\n%s", rc, strings.Join(r.lines, "\n"))
			}
		})
	}
}

// TestForgedFullPageDoesNotStopAllocations is the other half of issue 27's "1 TiB used": a page whose mem_used says
// 1 TiB (written by the tenant itself, or by a same-user process through /proc) no longer stops the tenant's
// processes from allocating within their quota: the ledger decides, the page only shows.
func TestForgedFullPageDoesNotStopAllocations(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	atomic.StoreUint64(&e.client.Page().MemUsed, 1<<40)
	r := e.run("ds_probe_rt", "init", "alloc:67108864", "alloc:1048576")
	if rc := r.get(t, "alloc:67108864", "rc"); rc != "0" {
		t.Errorf("the whole quota with the page saying 1 TiB used: rc %s, want 0\n%s", rc, strings.Join(r.lines, "\n"))
	}
	if rc := r.get(t, "alloc:1048576", "rc"); rc != "2" {
		t.Errorf("past the quota: rc %s, want 2", rc)
	}
}

// TestLedgerAfterInProcessPrivilegeDrop: a root process of a host tenant that drops to nobody in-process (a server
// after its start-up) can no longer open its page by path (clients/ is root's); the memory ledger was opened in the
// constructor, and a child it forks afterwards opens its own through /proc/self/fd. Both still allocate within the
// quota and are refused past it.
func TestLedgerAfterInProcessPrivilegeDrop(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	asNobody(t, e) // the run directory reachable as in a container; the process itself starts as root
	r := e.run("ds_probe_rt", "init", "setuid:65534", "alloc:33554432", "fork:16777216", "alloc:67108864")
	out := strings.Join(r.lines, "\n")
	if r.get(t, "setuid:65534", "rc") != "0" {
		t.Fatalf("setuid: %s", out)
	}
	if rc := r.get(t, "alloc:33554432", "rc"); rc != "0" {
		t.Errorf("32 MiB after the in-process drop: rc %s, want 0\n%s", rc, out)
	}
	if rc := r.get(t, "child", "rc"); rc != "0" {
		t.Errorf("a child forked after the drop, 16 MiB: rc %s, want 0\n%s", rc, out)
	}
	if rc := r.get(t, "alloc:67108864", "rc"); rc != "2" {
		t.Errorf("64 MiB more: rc %s, want 2\n%s", rc, out)
	}
}

// TestLedgerFillsHoles: the ledger's units are found around the units other processes hold: with a hole left by a
// process that exited below the units of one that still runs, a newcomer gets exactly what is left, no more.
func TestLedgerFillsHoles(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	first := e.start("ds_probe_rt", "init", "alloc:16777216", "pause")
	if r := first.until(); r.get(t, "alloc:16777216", "rc") != "0" {
		t.Fatalf("first: %v", r.lines)
	}
	second := e.start("ds_probe_rt", "init", "alloc:16777216", "pause")
	if r := second.until(); r.get(t, "alloc:16777216", "rc") != "0" {
		t.Fatalf("second: %v", r.lines)
	}
	_ = first.cmd.Process.Kill() // its units, below the second's, come back: a hole
	_ = first.cmd.Wait()
	r := e.run("ds_probe_rt", "init", "alloc:50331648", "alloc:1048576")
	if rc := r.get(t, "alloc:50331648", "rc"); rc != "0" {
		t.Errorf("48 MiB beside 16 MiB held in a 64 MiB tenant (a hole below them): rc %s, want 0\n%s", rc,
			strings.Join(r.lines, "\n"))
	}
	if rc := r.get(t, "alloc:1048576", "rc"); rc != "2" {
		t.Errorf("1 MiB more: rc %s, want 2", rc)
	}
}
