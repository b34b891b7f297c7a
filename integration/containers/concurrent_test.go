package containers

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Fifty containers created and removed at once through the shim: every one sees its quota, and afterwards no slot,
// client page, tenant directory, mount, shim or container process, or containerd container is left.
func TestFiftyConcurrentContainersLeaveNothing(t *testing.T) {
	e := need(t)
	const n = 50
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([]string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("ds-many-%02d", i)
			outs[i], errs[i] = e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=best-effort",
				"--env", fmt.Sprintf("DETSHARE_MEMORY=%dMiB", 64+i), imageRef, id, "simgpu-probe", "meminfo")
		}(i)
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Errorf("container %d: %v: %s", i, errs[i], outs[i])
			continue
		}
		if got, want := meminfoTotal(t, outs[i]), uint64(64+i)<<20; got != want {
			t.Errorf("container %d sees %d bytes, want its own quota %d", i, got, want)
		}
	}
	for i := 0; i < n; i++ {
		e.assertNoLeak(t, fmt.Sprintf("ds-many-%02d", i))
	}
	if ids := e.registered(t); len(ids) != 0 {
		t.Errorf("table still holds %v", ids)
	}
	for _, d := range []string{"clients", "tenants"} {
		if ents, _ := os.ReadDir(filepath.Join(e.runDir, d)); len(ents) != 0 {
			t.Errorf("%s/ holds %d entries", d, len(ents))
		}
	}
	if ls, _ := e.ctr("containers", "ls", "-q"); strings.Contains(ls, "ds-many-") {
		t.Errorf("containers left: %s", ls)
	}
}
