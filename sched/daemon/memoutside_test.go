package daemon

import (
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/table"
)

// Issue 27's "two bypassing processes of one tenant held 7.2 GiB while status showed 0B / 4.0G", and "a tenant with
// memory unset removes the MPS server limit for everyone": whatever the MPS limit, a tenant whose processes hold more
// device memory than its quota beyond the driver's context memory per process loses its largest process at the
// reaper's next round; within the allowance nothing is killed, and with memory_outside = report nothing either.
// The per-process memory is what NVML would say (a fake reader); the processes are real children of a host
// tenant's owner (this test process), attributed by the kernel's process tree.
func TestMemoryPastTheLibraryKillsTheTenantsLargestProcess(t *testing.T) {
	for _, mode := range []string{config.MemoryOutsideKill, config.MemoryOutsideReport} {
		t.Run(mode, func(t *testing.T) {
			dir, tb := newRunDir(t)
			if _, err := tb.Register(table.RegisterRequest{ID: "bypasser", Tier: table.TierBestEffort, GPU: 0, Weight: 1,
				MemLimit: 1 << 30, OwnerPID: os.Getpid()}); err != nil {
				t.Fatal(err)
			}
			// a neighbour with no memory quota (before: it lifted the MPS limit for everyone)
			if _, err := tb.Register(table.RegisterRequest{ID: "unlimited", Tier: table.TierBestEffort, GPU: 0,
				Weight: 1}); err != nil {
				t.Fatal(err)
			}
			big, small := sleeper(t), sleeper(t)
			const mib = 1 << 20
			var mu sync.Mutex
			mem := map[int]uint64{big.Process.Pid: 1700 * mib, small.Process.Pid: 100 * mib} // 1.8 GiB: within 1 GiB + 2 x 768 MiB
			read := func(int) (map[int]uint64, error) {
				mu.Lock()
				defer mu.Unlock()
				out := map[int]uint64{}
				for k, v := range mem {
					out[k] = v
				}
				return out, nil
			}
			c := testConfig()
			c.Tenants.MemoryOutside = mode
			s := startSched(t, dir, c, nil, func(o *Options) { o.ProcessMemory = read })
			time.Sleep(300 * time.Millisecond) // six reaper rounds
			if exited(big) || exited(small) || s.stats.MemoryKills.Load() != 0 {
				t.Fatal("a process was killed while its tenant held no more than its quota and the context allowance")
			}
			mu.Lock()
			mem[big.Process.Pid] = 3 << 30 // 3.1 GiB in all: past 1 GiB + 1.5 GiB
			mu.Unlock()
			deadline := time.Now().Add(3 * time.Second)
			for mode == config.MemoryOutsideKill && !exited(big) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if mode == config.MemoryOutsideKill {
				if !exited(big) || s.stats.MemoryKills.Load() < 1 {
					t.Fatalf("the tenant holds 3.1 GiB on a 1 GiB quota: its largest process still runs (kills %d)",
						s.stats.MemoryKills.Load())
				}
				if exited(small) {
					t.Fatal("the tenant's small process was killed too: one process per round, the largest")
				}
				return
			}
			time.Sleep(300 * time.Millisecond)
			if exited(big) || exited(small) || s.stats.MemoryKills.Load() != 0 {
				t.Fatal("memory_outside = report killed a process")
			}
		})
	}
}

// sleeper starts a child of this test process that lives until the test ends; exited tells whether it was killed.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	waits.Store(c, done)
	t.Cleanup(func() { _ = c.Process.Kill(); <-done })
	return c
}

var waits sync.Map // *exec.Cmd -> chan struct{} closed when it exited

func exited(c *exec.Cmd) bool {
	d, _ := waits.Load(c)
	select {
	case <-d.(chan struct{}):
		return c.ProcessState != nil && c.ProcessState.Sys().(syscall.WaitStatus).Signaled()
	default:
		return false
	}
}
