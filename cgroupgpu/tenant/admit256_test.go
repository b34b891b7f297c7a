package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// fill256 registers 255 tenants on one simulated GPU (132 SMs in 15 groups of 8, 80 GiB): 14 latency-critical ones
// guaranteed one SM group each and 241 best-effort ones, every one reserving 256 MiB. One group and 16640 MiB are
// left, and one slot.
func fill256(t *testing.T) string {
	t.Helper()
	dir := simRunDir(t, 1)
	for i := 0; i < table.MaxContainers-1; i++ {
		a := map[string]string{"detshare.io/memory": "256Mi"}
		id := fmt.Sprint("be-", i)
		if i < 14 {
			a["detshare.io/tier"], a["detshare.io/sms"] = "latency-critical", "8"
			id = fmt.Sprint("lc-", i)
		}
		if _, err := Register(context.Background(), dir, Request{ID: id, Quota: quota.Inputs{Annotations: a}.Resolve()}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func burstable(sms, mem string) quota.Resolved {
	return quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": sms,
		"detshare.io/memory": mem}}.Resolve()
}

// TestAdmissionExactAt256Tenants: admission sums the guarantees of every registered tenant, at the 256th as at the
// 1st (issue 28: the sums are now taken from the table in place): a guarantee one group or one MiB beyond what is
// left is refused, and the refusal names who holds what; exactly what is left is admitted; a deregistered tenant's
// guarantee is no longer counted; and concurrent registrations racing for the last groups admit exactly one.
func TestAdmissionExactAt256Tenants(t *testing.T) {
	dir := fill256(t)
	refused := func(id string, q quota.Resolved, want ...string) {
		t.Helper()
		_, err := Register(context.Background(), dir, Request{ID: id, Quota: q})
		var ae *quota.AdmissionError
		if !errors.As(err, &ae) {
			t.Fatalf("%s: %v, want an admission refusal", id, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: refusal %q does not say %q", id, err, w)
			}
		}
	}
	admitted := func(id string, q quota.Resolved) {
		t.Helper()
		if _, err := Register(context.Background(), dir, Request{ID: id, Quota: q}); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	refused("two-groups", burstable("16", "256Mi"), "14 of the 15 groups are guaranteed to others",
		`"lc-0" 1 groups/8 SMs (latency-critical)`, `"lc-13" 1 groups/8 SMs (latency-critical)`, "; 1 free")
	refused("one-mib-too-many", burstable("8", "16641Mi"), "65280Mi of 80Gi are reserved by others", `"be-254" 256Mi`,
		"; 16640Mi free")
	admitted("exact", burstable("8", "16640Mi")) // the 256th tenant: the last group, the last byte, the last slot

	// Freed slots: their guarantees must no longer count.
	for _, id := range []string{"exact", "lc-3", "be-100"} {
		if err := Deregister(dir, id); err != nil {
			t.Fatal(err)
		}
	}
	refused("freed-plus-one", burstable("16", "17153Mi"), "; 17152Mi free")
	admitted("freed", burstable("16", "17152Mi"))
	if err := Deregister(dir, "freed"); err != nil {
		t.Fatal(err)
	}

	// 253 tenants, 2 groups free, 3 slots free: 8 racing for both groups admit exactly one.
	if ok, no := registerRacing(t, dir, "race-", 8, burstable("16", "1Gi")); ok != 1 || no != 7 {
		t.Fatalf("racing for the last 2 groups: %d admitted, %d refused; want 1 and 7", ok, no)
	}
}

// TestAdmissionAllocationsDoNotGrow: registering (and deregistering) the 256th tenant allocates no more than the 1st
// (issue 28: admission copied every registered tenant and described each one, ~11 allocations per tenant, on every
// registration). Allocation counts, unlike times, do not depend on the machine's load.
func TestAdmissionAllocationsDoNotGrow(t *testing.T) {
	allocs := func(dir string) float64 {
		q := burstable("8", "1Gi")
		return testing.AllocsPerRun(20, func() {
			if _, err := Register(context.Background(), dir, Request{ID: "nth", Quota: q}); err != nil {
				t.Fatal(err)
			}
			if err := Deregister(dir, "nth"); err != nil {
				t.Fatal(err)
			}
		})
	}
	first := allocs(simRunDir(t, 1))
	last := allocs(fill256(t))
	t.Logf("allocations per registration and deregistration: %.0f for the 1st tenant, %.0f for the 256th", first, last)
	if last > first+16 {
		t.Fatalf("the 256th registration allocates %.0f times, the 1st %.0f: admission grows with the tenants", last, first)
	}
}

// TestReapedTenantsGuaranteeNotCounted: with a scheduler leading, a registration that admission refuses reaps host
// tenants whose owner died and admits again without them: the dead tenant's 14 SM groups no longer count.
func TestReapedTenantsGuaranteeNotCounted(t *testing.T) {
	dir := simRunDir(t, 1)
	owner := exec.Command("sleep", "60")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer owner.Process.Kill()
	if _, err := Register(context.Background(), dir, Request{ID: "dead-owner", Quota: burstable("112", "1Gi"),
		OwnerPID: owner.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	tb, err := table.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if _, err := tb.SetLeader(os.Getpid()); err != nil { // a live leader: registration reaps only when refused
		t.Fatal(err)
	}
	owner.Process.Kill()
	owner.Wait()
	if _, err := Register(context.Background(), dir, Request{ID: "newcomer", Quota: burstable("16", "1Gi")}); err != nil {
		t.Fatalf("2 groups beside a dead owner's 14: %v", err)
	}
	if _, ok := tb.Lookup("dead-owner"); ok {
		t.Error("the dead owner's tenant is still registered")
	}
}
