package libdetshare_test

import (
	"context"
	"math/bits"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// The fork handler takes every lock of the library in one order (src/ds_init.c, "Lock order") and releases them in
// the parent and the child. A tenant process forks 100 times while two of its threads keep making logical streams,
// launching, synchronising and rebinding under grants that change all the time, on the simulated GPU (a test
// double): no fork may deadlock in the handler, every child (which exits at once without CUDA, through the library's
// exit handler) must exit 0, and the threads must go on launching after the forks (no lock left held in the parent).
func TestForkWhileLaunchingTakesEveryLock(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)

	// the test plays a scheduler that changes the grant every 2 ms: launches rebind, green contexts get made
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var grantErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sets := []uint64{0b1100, 0b111, 0b11, 0b110000}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			g := sets[i%len(sets)]
			if err := e.tbl.PublishGrant(e.reg.Slot, table.Grant{Groups: g, SMs: 8 * uint32(bits.OnesCount64(g)),
				Mode: table.ModeSpatial}); err != nil {
				grantErr = err
				return
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, need(t, "tests/ds_probe_rt"), "init", "forkrace:100")
	cmd.Env = e.vars
	out, err := cmd.CombinedOutput()
	close(stop)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the probe did not finish in a minute (a fork deadlocked?):\n%s", out)
	}
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, out)
	}
	if grantErr != nil {
		t.Fatalf("publish grant: %v", grantErr)
	}
	t.Logf("%s", out)
	r := parse(string(out))
	all := strings.Join(r.lines, "\n")
	for key, want := range map[string]string{"rc": "0", "forks": "100", "children_ok": "100", "hung": "0",
		"stuck": "0"} {
		if got := r.get(t, "forkrace", key); got != want {
			t.Errorf("forkrace %s=%s, want %s\n%s", key, got, want, all)
		}
	}
	if r.num(t, "forkrace", "rounds_during") == 0 {
		t.Errorf("the launching threads made no round while the process forked:\n%s", all)
	}
	if r.num(t, "forkrace", "rounds_after") == 0 {
		t.Errorf("the launching threads made no round after the forks (a lock left held?):\n%s", all)
	}
}
