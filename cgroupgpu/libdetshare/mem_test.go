package libdetshare_test

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

const MiB = 1 << 20

// A process with no quota file sees the driver exactly as it is: same answers with and without the library.
func TestNoQuotaFileIsPassThrough(t *testing.T) {
	steps := []string{"init", "info", "total", "alloc:6442450944", "info", "launch:3", "free-all", "info"}
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			bare := newEnv(t, false).run(prog, steps...)
			pre := newEnv(t, true).run(prog, steps...)
			if strings.Join(bare.lines, "\n") != strings.Join(pre.lines, "\n") {
				t.Fatalf("output differs with the library and no quota file:\nwithout:\n%s\nwith:\n%s",
					strings.Join(bare.lines, "\n"), strings.Join(pre.lines, "\n"))
			}
			if got := pre.num(t, "total", "bytes"); got != simMem {
				t.Fatalf("cuDeviceTotalMem = %d without a tenant, want the device's %d", got, simMem)
			}
			if pre.get(t, "alloc:6442450944", "rc") != "0" || pre.get(t, "launch", "ok") != "1" {
				t.Fatalf("pass-through process was restricted: %v", pre.lines)
			}
		})
	}
}

// Every allocation path is charged with what it allocates, and every free credits exactly that back.
func TestEveryAllocationPathCounted(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(256*MiB, "")
			steps := []string{"init", "info",
				"alloc:1048576", "info",
				"pitch:1000x100", "info",
				"managed:65536", "info",
				"async:131072", "info",
				"pool:262144", "info",
				"vmm:2097152", "info",
				"vmmhost:2097152", "info",
				"array:64x32", "info",
				"array3d:16x8x4", "info",
				"mipmap:64x64:3", "info",
				"free-all", "info", "total"}
			r := e.run(prog, steps...)
			for _, l := range r.order {
				if l.kv["rc"] != "0" {
					t.Fatalf("step %s failed: %v\n%s", l.step, l.kv, strings.Join(r.lines, "\n"))
				}
			}
			pitch := r.num(t, "pitch:1000x100", "pitch")
			if pitch < 1000 {
				t.Fatalf("pitch %d < width 1000", pitch)
			}
			want := []uint64{1048576, pitch * 100, 65536, 131072, 262144, 2097152, 0 /* host VMM */, 64 * 32 * 4,
				16 * 8 * 4 * 4, (64*64 + 32*32 + 16*16) * 4}
			names := []string{"alloc", "pitch", "managed", "async", "pool", "vmm", "vmmhost", "array", "array3d",
				"mipmap"}
			free, total := r.infos(t)
			if len(free) != len(want)+2 {
				t.Fatalf("%d info lines, want %d", len(free), len(want)+2)
			}
			for i, tt := range total {
				if tt != 256*MiB {
					t.Fatalf("info %d: total %d, want the quota %d", i, tt, 256*MiB)
				}
			}
			if free[0] != 256*MiB {
				t.Fatalf("free before any allocation = %d, want %d", free[0], 256*MiB)
			}
			for i, w := range want {
				if got := free[i] - free[i+1]; got != w {
					t.Errorf("%s charged %d bytes, want %d", names[i], got, w)
				}
			}
			if last := free[len(free)-1]; last != 256*MiB {
				t.Errorf("free after freeing everything = %d, want %d (frees not credited)", last, 256*MiB)
			}
			if got := r.num(t, "total", "bytes"); got != 256*MiB {
				t.Errorf("cuDeviceTotalMem_v2 = %d, want the quota %d", got, 256*MiB)
			}
			if used := e.memUsed(); used != 0 {
				t.Errorf("client page mem_used = %d after exit, want 0", used)
			}
			if peak := atomic.LoadUint64(&e.client.Page().MemPeak); peak < 1048576+pitch*100 {
				t.Errorf("mem_peak %d too low", peak)
			}
		})
	}
}

// An allocation that does not fit is refused with CUDA_ERROR_OUT_OF_MEMORY on every path and changes nothing.
func TestOverQuotaRefused(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			r := e.run(prog, "init", "alloc:33554432", "alloc:33554432", "info",
				"alloc:1", "pitch:4096x1", "managed:4096", "async:4096", "pool:4096", "vmm:2097152",
				"array:16x16", "array3d:4x4x4", "mipmap:16x16:2", "info", "free-last", "info", "alloc:16777216",
				"info")
			free, total := r.infos(t)
			if free[0] != 0 || total[0] != 64*MiB {
				t.Fatalf("at the quota: free %d total %d, want 0 and %d", free[0], total[0], 64*MiB)
			}
			refused := []string{"alloc:1", "pitch:4096x1", "managed:4096", "async:4096", "pool:4096", "vmm:2097152",
				"array:16x16", "array3d:4x4x4", "mipmap:16x16:2"}
			for _, s := range refused {
				if rc := r.get(t, s, "rc"); rc != "2" {
					t.Errorf("%s over quota returned %s, want 2 (CUDA_ERROR_OUT_OF_MEMORY)", s, rc)
				}
			}
			if free[1] != 0 {
				t.Errorf("refused allocations changed the tenant's usage: free %d", free[1])
			}
			if free[2] != 32*MiB {
				t.Errorf("after freeing 32 MiB: free %d, want %d", free[2], 32*MiB)
			}
			if r.get(t, "alloc:16777216", "rc") != "0" || free[3] != 16*MiB {
				t.Errorf("allocation within the freed room: rc %s free %d", r.get(t, "alloc:16777216", "rc"), free[3])
			}
			if n := atomic.LoadUint64(&e.client.Page().OOMRefusals); n != uint64(len(refused)) {
				t.Errorf("oom_refusals = %d, want %d", n, len(refused))
			}
			if peak := atomic.LoadUint64(&e.client.Page().MemPeak); peak != 64*MiB {
				t.Errorf("mem_peak = %d, want exactly the quota %d", peak, 64*MiB)
			}
		})
	}
}

// holder is a probe process that allocates and waits (stdin open) so that another process sees its usage.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func (e *env) startHolder(prog string, steps ...string) *holder {
	t := e.t
	t.Helper()
	cmd := exec.Command(need(t, "tests/"+prog), append(steps, "hold")...)
	cmd.Env = e.vars
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var seen []string
	for h.out.Scan() {
		line := h.out.Text()
		seen = append(seen, line)
		if line == "holding" {
			return h
		}
		if f := strings.Fields(line); len(f) > 1 && f[1] != "rc=0" {
			t.Fatalf("holder step failed: %s", line)
		}
	}
	t.Fatalf("holder exited before holding: %v", seen)
	return nil
}

func (h *holder) release(t *testing.T) {
	t.Helper()
	h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
}

// The quota is the tenant's, shared by all its processes: each sees what the others use.
func TestProcessesOfOneTenantShareTheQuota(t *testing.T) {
	for i, prog := range probes {
		other := probes[1-i]
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(64*MiB, "")
			a := e.startHolder(prog, "init", "alloc:41943040")
			if used := e.memUsed(); used != 40*MiB {
				t.Fatalf("tenant usage with the holder = %d, want %d", used, 40*MiB)
			}
			if n := e.client.LiveProcesses(); n != 1 {
				t.Fatalf("%d live process entries, want 1", n)
			}
			r := e.run(other, "init", "info", "total", "alloc:33554432", "alloc:16777216", "info", "free-all", "info")
			free, total := r.infos(t)
			if total[0] != 64*MiB || free[0] != 24*MiB {
				t.Errorf("second process sees free %d total %d, want %d of %d", free[0], total[0], 24*MiB, 64*MiB)
			}
			if r.get(t, "alloc:33554432", "rc") != "2" {
				t.Errorf("32 MiB beyond the shared quota was not refused: %v", r.steps["alloc:33554432"])
			}
			if r.get(t, "alloc:16777216", "rc") != "0" || free[1] != 8*MiB {
				t.Errorf("16 MiB within the shared quota: rc %s, free after %d (want 8 MiB)",
					r.get(t, "alloc:16777216", "rc"), free[1])
			}
			if free[2] != 24*MiB {
				t.Errorf("after the second process freed: free %d, want %d", free[2], 24*MiB)
			}
			a.release(t)
			if used := e.memUsed(); used != 0 {
				t.Errorf("tenant usage after both exited = %d, want 0", used)
			}
			if n := e.client.LiveProcesses(); n != 0 {
				t.Errorf("%d live process entries after both exited, want 0", n)
			}
		})
	}
}

// A process killed with SIGKILL cannot release anything; the reaper (internal/table) credits its memory back.
func TestSIGKILLedProcessCreditedByReaper(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	a := e.startHolder("ds_probe_rt", "init", "alloc:41943040", "vmm:2097152")
	if used := e.memUsed(); used != 42*MiB {
		t.Fatalf("usage = %d, want %d", used, 42*MiB)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	if used := e.memUsed(); used != 42*MiB {
		t.Fatalf("usage right after SIGKILL = %d, want still %d (nothing ran in the dead process)", used, 42*MiB)
	}
	time.Sleep(30 * time.Millisecond) // a scan judges only processes that started in an earlier clock tick (10 ms)
	ps, err := table.ScanProcesses()
	if err != nil {
		t.Fatal(err)
	}
	n, bytes := e.client.ReapDeadProcesses(ps)
	if n != 1 || bytes != 42*MiB {
		t.Fatalf("reaper: %d entries, %d bytes; want 1 entry, %d bytes", n, bytes, 42*MiB)
	}
	if used := e.memUsed(); used != 0 {
		t.Fatalf("usage after reaping = %d, want 0", used)
	}
	// the room is usable again
	r := e.run("ds_probe_rt", "init", "alloc:67108864", "info")
	if r.get(t, "alloc:67108864", "rc") != "0" {
		t.Fatalf("the whole quota after reaping: %v", r.lines)
	}
}

// Under MPS the driver-enforced limit is set for the process before the driver initialises.
func TestMPSPinnedMemoryBackstop(t *testing.T) {
	pipe := t.TempDir()
	e := newEnv(t, true).withTenant(64*MiB, pipe)
	r := e.run("ds_probe_rt", "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "env:CUDA_MPS_PIPE_DIRECTORY")
	if v := r.get(t, "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value"); v != "0=64M" {
		t.Fatalf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = %q, want 0=64M", v)
	}
	// exec'd processes never see env edits made at create time: the library points the driver at the tenant's
	// MPS pipe directory itself
	if v := r.get(t, "env:CUDA_MPS_PIPE_DIRECTORY", "value"); v != pipe {
		t.Fatalf("CUDA_MPS_PIPE_DIRECTORY = %q, want the quota file's %q", v, pipe)
	}
	e2 := newEnv(t, true).withTenant(64*MiB, "")
	r = e2.run("ds_probe_rt", "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
	if v := r.get(t, "env:CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value"); v != "" {
		t.Fatalf("without MPS the variable is set to %q", v)
	}
}

// A forked child gets its own process entry starting at zero; the parent's allocations stay the parent's.
func TestForkedChildHasItsOwnEntry(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	r := e.run("ds_probe_rt", "init", "alloc:8388608", "fork:4194304", "info")
	if rc := r.get(t, "child", "rc"); rc != "0" {
		t.Fatalf("child allocation: rc %s\n%s", rc, strings.Join(r.lines, "\n"))
	}
	if free := r.num(t, "child", "free"); free != 52*MiB {
		t.Fatalf("child sees free %d, want %d (parent 8 MiB + child 4 MiB charged)", free, 52*MiB)
	}
	free, _ := r.infos(t)
	if free[0] != 56*MiB {
		t.Fatalf("parent after the child exited sees free %d, want %d (child credited at exit)", free[0], 56*MiB)
	}
}

// cuGetProcAddress hands back the wrapper of exactly the variant the driver chose (ABI version, per-thread), and
// passes everything else through; dlsym in both glibc versions is ours.
func TestProcAddressAndDlsym(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	r := e.run("ds_probe_rt", "init",
		"procaddr:cuLaunchKernel:4000:0", "procaddr:cuLaunchKernel:7000:2", "procaddr:cuMemAlloc:3020:0",
		"procaddr:cuGetProcAddress:12000:0", "procaddr:cuDeviceGet:2000:0", "procaddr:cuGetExportTable:3000:0",
		"procaddr:cuMemAllocAsync:11020:2", "dlsym:cuMemAlloc_v2", "dlsym:cuGetExportTable", "dlsym:cuDeviceGet")
	want := map[string][2]string{
		"procaddr:cuLaunchKernel:4000:0":    {"cuLaunchKernel", "libdetshare.so"},
		"procaddr:cuLaunchKernel:7000:2":    {"cuLaunchKernel_ptsz", "libdetshare.so"},
		"procaddr:cuMemAlloc:3020:0":        {"cuMemAlloc_v2", "libdetshare.so"},
		"procaddr:cuGetProcAddress:12000:0": {"cuGetProcAddress_v2", "libdetshare.so"},
		"procaddr:cuDeviceGet:2000:0":       {"cuDeviceGet", "libcuda.so.1"},
		"procaddr:cuGetExportTable:3000:0":  {"cuGetExportTable", "libcuda.so.1"},
		"procaddr:cuMemAllocAsync:11020:2":  {"cuMemAllocAsync_ptsz", "libdetshare.so"},
		"dlsym:cuMemAlloc_v2":               {"cuMemAlloc_v2", "libdetshare.so"},
		"dlsym:cuGetExportTable":            {"cuGetExportTable", "libcuda.so.1"},
		"dlsym:cuDeviceGet":                 {"cuDeviceGet", "libcuda.so.1"},
	}
	for step, w := range want {
		if sym, obj := r.get(t, step, "sym"), r.get(t, step, "obj"); sym != w[0] || obj != w[1] {
			t.Errorf("%s -> %s in %s, want %s in %s", step, sym, obj, w[0], w[1])
		}
	}
	// old and new glibc dlsym entries, and RTLD_NEXT relative to the caller (another interposer after us)
	e.vars = append(e.vars, "LD_PRELOAD="+need(t, "lib/libdetshare.so")+" "+need(t, "tests/libds_nextlib.so"))
	d := e.run("ds_dlsym_old")
	for k, w := range map[string]string{"old": "libdetshare.so", "new": "libdetshare.so", "export": "libcuda.so.1",
		"next": "libc.so.6"} {
		if got := d.get(t, k, "obj"); got != w {
			t.Errorf("dlsym %s: answered by %s, want %s", k, got, w)
		}
	}
	if d.get(t, "getpid", "ok") != "1" {
		t.Errorf("getpid through the RTLD_NEXT interposer failed: %v", d.lines)
	}
}

// Launch results are identical with and without the library, and launches are counted in the client page.
func TestLaunchCountedAndUnchanged(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			bare := newEnv(t, false).run(prog, "init", "launch:10")
			e := newEnv(t, true).withTenant(0, "")
			with := e.run(prog, "init", "launch:10")
			if bare.get(t, "launch", "ok") != "1" || with.get(t, "launch", "ok") != "1" {
				t.Fatalf("launch results: without %v, with %v", bare.lines, with.lines)
			}
			if n := atomic.LoadUint64(&e.client.Page().Launches); n != 10 {
				t.Fatalf("client page launches = %d, want 10", n)
			}
		})
	}
}

var _ = strconv.Itoa
var _ = time.Second

// NVML (nvidia-smi, pynvml, vLLM) shows the tenant its quota and usage, like cuMemGetInfo (simulated NVML).
func TestNVMLShowsTheQuota(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	r := e.run("ds_probe_rt", "init", "alloc:16777216", "nvml")
	if r.get(t, "nvml", "rc") != "0" {
		t.Fatalf("nvml: %v", r.lines)
	}
	if tot, free, used := r.num(t, "nvml", "total"), r.num(t, "nvml", "free"), r.num(t, "nvml", "used"); tot != 64*MiB ||
		free != 48*MiB || used != 16*MiB {
		t.Fatalf("NVML shows total %d free %d used %d, want %d %d %d", tot, free, used, 64*MiB, 48*MiB, 16*MiB)
	}
	if tot := newEnv(t, true).run("ds_probe_rt", "nvml").num(t, "nvml", "total"); tot != simMem {
		t.Fatalf("without a tenant NVML total = %d, want the device's %d", tot, simMem)
	}
}

// A bad quota file or a table that does not match is reported clearly and the process's CUDA work is refused
// (fail-closed, issue 27): a process of a tenant never runs without its quota and grant. Before, it ran unshared.
func TestBrokenTenantFilesFailClosed(t *testing.T) {
	cases := []struct {
		name, edit, wantLog string
	}{
		{"bad slot", "slot=abc", "slot=abc is not an integer in 0..255"},
		{"wrong generation", "slot_gen=999", "quota file says generation 999"},
		{"missing table", "table=/nonexistent/table", "table /nonexistent/table"},
		{"bad version", "version=7", "version=7, this library reads version=1"},
		{"missing slot", "-slot", "slot, table and client_page are required"}, // "-key": the line is dropped
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, true).withTenant(16*MiB, "")
			data, err := os.ReadFile(e.quotaFile)
			if err != nil {
				t.Fatal(err)
			}
			drop := strings.HasPrefix(c.edit, "-")
			key, _, _ := strings.Cut(strings.TrimPrefix(c.edit, "-"), "=")
			var out []string
			for _, l := range strings.Split(string(data), "\n") {
				if strings.HasPrefix(l, key+"=") {
					if drop {
						continue
					}
					l = c.edit
				}
				out = append(out, l)
			}
			if err := os.WriteFile(e.quotaFile, []byte(strings.Join(out, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, prog := range probes {
				r := e.run(prog, "init", "alloc:33554432")
				joined := strings.Join(r.lines, "\n")
				if !strings.Contains(joined, c.wantLog) || !strings.Contains(joined, "refuses this process's CUDA work") {
					t.Errorf("%s: log does not explain the refusal (want %q):\n%s", prog, c.wantLog, joined)
				}
				if rc := r.get(t, "init", "rc"); rc != "800" { // CUDA_ERROR_NOT_PERMITTED
					t.Errorf("%s: init rc %s, want 800 (refused):\n%s", prog, rc, joined)
				}
				if rc := r.get(t, "alloc:33554432", "rc"); rc == "0" {
					t.Errorf("%s: a refused process allocated device memory:\n%s", prog, joined)
				}
			}
		})
	}
}

// A cuGetProcAddress answer that is not one of the driver's exports still gets the wrapper of the variant the
// name and version select (and the allocation is counted); per-thread lookups get the per-thread wrapper.
func TestProcAddressInternalPointerMappedByName(t *testing.T) {
	e := newEnv(t, true).withTenant(64*MiB, "")
	for i, v := range e.vars {
		if strings.HasPrefix(v, "LD_LIBRARY_PATH=") {
			e.vars[i] = "LD_LIBRARY_PATH=" + need(t, "tests/nulldrv")
		}
	}
	r := e.run("ds_procmap")
	if sym, obj := r.get(t, "memalloc", "sym"), r.get(t, "memalloc", "obj"); sym != "cuMemAlloc_v2" ||
		obj != "libdetshare.so" {
		t.Errorf("cuMemAlloc 3020 -> %s in %s, want cuMemAlloc_v2 in libdetshare.so", sym, obj)
	}
	if r.get(t, "call", "rc") != "0" || r.get(t, "call", "ptr") != "1" {
		t.Errorf("calling the mapped cuMemAlloc: %v", r.steps["call"])
	}
	// the process has exited (its memory credited at exit): the charge shows in the peak
	if peak := atomic.LoadUint64(&e.client.Page().MemPeak); peak != 1<<20 {
		t.Errorf("allocation through the mapped wrapper charged %d bytes, want %d", peak, 1<<20)
	}
	// an exported variant this library does not know is passed through, never wrapped with another ABI
	if sym, obj := r.get(t, "future", "sym"), r.get(t, "future", "obj"); sym != "cuMemAlloc_v9" || obj != "libcuda.so.1" {
		t.Errorf("unknown exported variant -> %s in %s, want cuMemAlloc_v9 in libcuda.so.1 (pass-through)", sym, obj)
	}
	if sym := r.get(t, "launchpt", "sym"); sym != "cuLaunchKernel_ptsz" {
		t.Errorf("per-thread cuLaunchKernel -> %s, want cuLaunchKernel_ptsz", sym)
	}
}
