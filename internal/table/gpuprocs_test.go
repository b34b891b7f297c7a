package table

import (
	"os"
	"os/exec"
	"testing"
)

// TestAttributorFromWhatTheKernelSays: a process is a tenant's when it maps the tenant's client page (the kernel's
// /proc/<pid>/maps), or descends from a host tenant's owner; an entry a tenant writes into its page naming some other
// process attributes nothing to it (issue 27: status sets NVML's per-process memory against the library's charge).
func TestAttributorFromWhatTheKernelSays(t *testing.T) {
	tb := newTable(t)
	c, err := tb.Register(RegisterRequest{ID: "mapper", Tier: TierBestEffort, GPU: 0, Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	// The test process is a host tenant's owner; its child (sleep) works for that tenant.
	h, err := tb.Register(RegisterRequest{ID: "host", Tier: TierBestEffort, GPU: 0, Weight: 1, OwnerPID: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	// The container tenant's page names the sleeper as one of its live processes: a forgery.
	cl, err := OpenClientPage(c.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := &cl.Page().Procs[0]
	p.HostPID, p.State = uint64(sleeper.Process.Pid), ProcLive
	regs := tb.List()

	a := tb.NewAttributor(regs, nil)
	if id, ok := a.Tenant(os.Getpid()); !ok || id != "mapper" {
		t.Errorf("the test process maps mapper's page: attributed to %q (%v)", id, ok)
	}
	if id, ok := a.Tenant(sleeper.Process.Pid); !ok || id != "host" {
		t.Errorf("the owner's child: attributed to %q (%v), want host (and never mapper, whose page only names it)", id, ok)
	}
	cl.Close()
	if id, ok := tb.NewAttributor(regs, nil).Tenant(os.Getpid()); ok && id == "mapper" {
		t.Error("a process that no longer maps the page is still mapper's")
	}
	if id, ok := a.Tenant(1); ok {
		t.Errorf("init attributed to %s", id)
	}
	_ = h
}
