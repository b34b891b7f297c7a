package containers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/table"
)

// Issue 13 item 6: with the table full, a container that asked for latency-critical with 8 SMs is refused with a
// clear create error and leaves nothing behind (default policy); with [tenants] fail_open = true it runs unshared,
// a WARNING line on its stderr and the event counted. A container that asked for nothing runs as under runc either
// way.
func TestTableFullRefusedOrFailOpenLoudly(t *testing.T) {
	e := need(t)
	// The fillers register from this process, as the shim would: simulated GPU (a test double), our scheduler.
	t.Setenv("DETSHARE_SIMGPU", "1")
	t.Setenv("DETSHARE_BIN", filepath.Join(e.bin, "detshare"))
	var fillers []string
	defer func() {
		for _, id := range fillers {
			tenant.Deregister(e.runDir, id)
		}
	}()
	for i := 0; ; i++ {
		id := fmt.Sprintf("filler-%d", i)
		_, err := registrar.Register(context.Background(), e.runDir, tenant.Request{ID: id,
			Quota: quota.Inputs{Env: []string{"DETSHARE_TIER=best-effort"}}.Resolve()})
		if err != nil {
			if !strings.Contains(err.Error(), "table full") {
				t.Fatalf("filling the table: %v", err)
			}
			break
		}
		fillers = append(fillers, id)
		if i > table.MaxContainers {
			t.Fatal("table never filled")
		}
	}
	before := failopen.Count(e.runDir)
	id := "ds-full-lc"
	out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=latency-critical", "--env", "DETSHARE_SMS=8",
		imageRef, id, "sh", "-c", "echo RAN")
	if err == nil || strings.Contains(out, "RAN") || !strings.Contains(out, "table full") || !strings.Contains(out, "refused") ||
		!strings.Contains(out, "fail_open") {
		t.Errorf("table full, default policy: %v: %s; want a create error naming the full table and fail_open", err, out)
	}
	e.ctr("containers", "rm", id)
	e.assertNoLeak(t, id)

	plain := "ds-full-plain"
	if out, err := e.ctr("run", "--rm", "--runtime", shimRuntime, imageRef, plain, "sh", "-c", "echo RAN"); err != nil || !strings.Contains(out, "RAN") {
		t.Errorf("container without DetShare settings on a full table: %v: %s", err, out)
	}

	if err := os.WriteFile(e.hostConfig(), []byte("[tenants]\nfail_open = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(e.hostConfig())
	out, err = e.ctr("run", "--rm", "--runtime", shimRuntime, "--env", "DETSHARE_TIER=latency-critical", "--env", "DETSHARE_SMS=8",
		imageRef, id, "sh", "-c", "simgpu-probe meminfo; test -e /run/detshare/quota && echo MOUNTED || echo NOT-MOUNTED")
	if err != nil || !strings.Contains(out, "detshare: WARNING: this tenant asked for DetShare but runs WITHOUT it") ||
		!strings.Contains(out, "table full") || !strings.Contains(out, "NOT-MOUNTED") {
		t.Errorf("table full, fail_open: %v: %q; want it to run unshared with the WARNING line", err, out)
	}
	e.assertNoLeak(t, id)
	if n := failopen.Count(e.runDir); n != before+1 {
		t.Errorf("fail-open events %d, want %d", n, before+1)
	}
	if err := e.startDocker(); err != nil {
		t.Errorf("dockerd not available: %v", err)
	} else {
		out, err := e.docker("run", "--rm", "--runtime=detshare", "--network", "none", "-e", "DETSHARE_TIER=latency-critical",
			"-e", "DETSHARE_SMS=8", dockerImage, "sh", "-c", "echo RAN")
		if err != nil || !strings.Contains(out, "RAN") || !strings.Contains(out, "detshare: WARNING") {
			t.Errorf("docker, table full, fail_open: %v: %q", err, out)
		}
	}
}
