package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/sched/view"
)

// TestStatusShowsMemoryOutsideTheLibrary is issue 27's "two bypassing processes held 7.2 GiB while status showed
// 0B / 4.0G", on the simulated GPU (a test double, whose NVML double reports each process's device memory): a host
// tenant's process allocates 256 MiB through libdetshare and 512 MiB with cuMemAlloc_v2 resolved past it (rawalloc,
// dlvsym on libc's handle); a second process of the tenant started without the library at all (LD_PRELOAD emptied)
// allocates 128 MiB. `detshare status --json` must report the library's 256 MiB as used, the 896 MiB NVML sees for
// the tenant's processes and the 640 MiB the library never charged; the text flags it. Before, status showed the
// 256 MiB alone. A neighbour that allocates only through the library has nothing outside.
func TestStatusShowsMemoryOutsideTheLibrary(t *testing.T) {
	bd := buildDir()
	lib := filepath.Join(bd, "lib", "libdetshare.so")
	probe := filepath.Join(bd, "tests", "ds_probe_rt")
	sim := filepath.Join(bd, "lib", "simgpu")
	for _, f := range []string{lib, probe, filepath.Join(sim, "libcuda.so.1"), filepath.Join(sim, "libnvidia-ml.so.1")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("%s missing: run `make build` first", f)
		}
	}
	e := newRunEnv(t)
	e.lib = lib
	withSim := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+sim, "DETSHARE_SIMGPU_STATE="+filepath.Join(e.dir, "simgpu.state"))
		return cmd
	}
	start := func(name string, args ...string) *exec.Cmd {
		cmd := withSim(e.detshare(append([]string{"run", "--memory", "2Gi", "--name", name, "--"}, args...)...))
		stdin, _ := cmd.StdinPipe()
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(out.String(), "paused") < strings.Count(strings.Join(args, " "), "pause") {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not reach its pause:\n%s", name, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return cmd
	}
	// Both processes of the bypasser pause, holding their memory, until the test closes their stdin.
	// (A background job's stdin is /dev/null unless redirected: descriptor 3 keeps the pipe for it.)
	start("bypasser", "/bin/sh", "-c", "exec 3<&0; "+probe+" init alloc:268435456 rawalloc:1610612736 pause <&3 & "+
		"LD_PRELOAD= "+probe+" init alloc:134217728 pause; wait")
	start("neighbour", probe, "init", "alloc:268435456", "pause")

	st := withSim(e.detshare("status", "--json"))
	out, err := st.Output()
	if err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var snap view.Snapshot
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	got := map[string]view.Tenant{}
	for _, v := range snap.Tenants {
		got[v.ID] = v
	}
	b, n := got["bypasser"], got["neighbour"]
	if !b.MemGPUKnown || !n.MemGPUKnown {
		t.Fatalf("status did not read the per-process GPU memory (NVML double):\n%s", out)
	}
	const mib = 1 << 20
	// 1.5 GiB + 128 MiB outside is more than two processes' ContextAllowance (what a driver keeps per context)
	if b.MemUsed != 256*mib || b.MemGPU < 1920*mib || b.MemOutside < 1664*mib || !b.MemOutsideFlagged {
		t.Errorf("bypasser: used %d MiB, GPU %d MiB, outside %d MiB, flagged %v; want 256, >= 1920, >= 1664, flagged",
			b.MemUsed/mib, b.MemGPU/mib, b.MemOutside/mib, b.MemOutsideFlagged)
	}
	if n.MemUsed != 256*mib || n.MemGPU < 256*mib || n.MemOutside >= 64*mib || n.MemOutsideFlagged {
		t.Errorf("neighbour: used %d MiB, GPU %d MiB, outside %d MiB; want 256, >= 256, (almost) nothing outside",
			n.MemUsed/mib, n.MemGPU/mib, n.MemOutside/mib)
	}
	txt, err := withSim(e.detshare("status")).Output()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, txt)
	}
	for _, l := range strings.Split(string(txt), "\n") {
		if strings.Contains(l, "bypasser") && !strings.Contains(l, "OUTSIDE the library") {
			t.Errorf("status does not flag the bypasser's memory:\n%s", txt)
		}
		if strings.Contains(l, "neighbour") && strings.Contains(l, "OUTSIDE") {
			t.Errorf("status flags a tenant that allocates only through the library:\n%s", txt)
		}
	}
}
