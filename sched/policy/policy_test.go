package policy

import (
	"fmt"
	"math/bits"
	"math/rand"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
)

func groups(n int, sms uint32) []uint32 {
	g := make([]uint32, n)
	for i := range g {
		g[i] = sms
	}
	return g
}

// checkInvariants asserts what every decision must satisfy, whatever the policy.
func checkInvariants(t *testing.T, gs []uint32, ts []Tenant, d Decision) {
	t.Helper()
	all := uint64(1)<<len(gs) - 1
	var excl uint64
	for i := range ts {
		if d.Exclusive[i]&excl != 0 {
			t.Fatalf("exclusive groups overlap: tenant %s %b", ts[i].ID, d.Exclusive[i])
		}
		excl |= d.Exclusive[i]
	}
	var busyUnion uint64
	borrower, throttled := false, false
	for i, a := range ts {
		throttled = throttled || (a.Tier == table.TierLatencyCritical && a.Busy) || d.Grants[i].Gate.Depth > 0
	}
	for i, a := range ts {
		if a.Busy && borrows(a) {
			borrower = true
		}
		g := d.Grants[i].Groups
		if g&^all != 0 {
			t.Fatalf("%s granted groups outside the split: %b", a.ID, g)
		}
		var sms uint32
		for b := g; b != 0; b &= b - 1 {
			sms += gs[bits.TrailingZeros64(b)]
		}
		if sms != d.Grants[i].SMs {
			t.Fatalf("%s: SMs %d, groups hold %d", a.ID, d.Grants[i].SMs, sms)
		}
		if other := excl &^ d.Exclusive[i]; g&other != 0 {
			t.Fatalf("%s granted another tenant's exclusive groups: %b & %b", a.ID, g, other)
		}
		if a.Busy {
			if g&busyUnion != 0 {
				t.Fatalf("busy grants overlap at %s: %b", a.ID, g&busyUnion)
			}
			busyUnion |= g
			if a.Tier != table.TierBestEffort && bits.OnesCount64(g) < a.Guarantee && a.Guarantee <= len(gs) {
				t.Fatalf("busy %s got %d groups, guarantee %d", a.ID, bits.OnesCount64(g), a.Guarantee)
			}
		}
	}
	// Work conservation: with anyone busy, every group is either used by a busy tenant or held exclusively by an idle
	// one; unless a latency-critical tenant is busy (its pinned guarantee beside throttled neighbours may leave groups
	// idle: that is the point of throttling).
	if borrower && !throttled && (busyUnion|excl) != all {
		t.Fatalf("not work-conserving: busy %b exclusive %b all %b", busyUnion, excl, all)
	}
}

func TestDecideRules(t *testing.T) {
	o := DefaultOptions()
	tp := o
	tp.Kind = TPOTFirst
	cases := []struct {
		name    string
		n       int
		opts    Options
		tenants []Tenant
		want    []int    // groups per tenant
		mask    []uint64 // exact masks when given (0 entries are not checked)
	}{
		{"pinned LC idle keeps guarantee, BE takes the rest", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Pinned: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{4, 4}, []uint64{0x0f, 0xf0}},
		{"LC idle keeps guarantee and is offered the rest but BE's floor, BE takes the rest", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{7, 4}, []uint64{0x7f, 0xf0}},
		{"pinned LC idle lending: BE borrows everything, LC keeps its grant", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Lend: true, Pinned: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{4, 8}, []uint64{0x0f, 0xff}},
		{"pinned LC busy does not borrow idle groups; idle BE offered the complement (a static partition)", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 4, Guarantee: 2, Busy: true, Pinned: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1},
		}, []int{2, 6}, []uint64{0x03, 0xfc}},
		{"pinned LC busy lending: guarantee back, BE keeps the complement", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Lend: true, Busy: true, Pinned: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: 0xff},
		}, []int{4, 4}, []uint64{0x0f, 0xf0}},
		{"LC busy expands over an idle BE", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 4, Guarantee: 2, Busy: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1},
		}, []int{8, 1}, []uint64{0xff, 0}},
		{"LC busy lending expands, busy BE keeps the highest group it had", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4, Lend: true, Busy: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: 0xf0},
		}, []int{7, 1}, []uint64{0x7f, 0x80}},
		{"burstable busy: guarantee + weighted borrow", 8, o, []Tenant{
			{Slot: 0, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 2, Busy: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{4, 4}, nil},
		{"burstable idle lends to best-effort", 8, o, []Tenant{
			{Slot: 0, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 2},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{2, 8}, nil},
		{"weights split the shared part 3:1", 8, o, []Tenant{
			{Slot: 0, ID: "a", Tier: table.TierBestEffort, Weight: 3, Busy: true},
			{Slot: 1, ID: "b", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{6, 2}, nil},
		{"guarantee above weighted share is a floor", 8, o, []Tenant{
			{Slot: 0, ID: "bu", Tier: table.TierBurstable, Weight: 1, Guarantee: 6, Busy: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 3, Busy: true},
		}, []int{6, 2}, nil},
		{"every busy tenant gets a group", 4, o, []Tenant{
			{Slot: 0, ID: "a", Tier: table.TierBestEffort, Weight: 100, Busy: true},
			{Slot: 1, ID: "b", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{3, 1}, nil},
		{"idle best-effort offered the shared groups", 8, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Pinned: true},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1},
		}, []int{2, 6}, []uint64{0x03, 0xfc}},
		{"all reserved: best-effort gets nothing", 4, o, []Tenant{
			{Slot: 0, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 4},
			{Slot: 1, ID: "be", Tier: table.TierBestEffort, Weight: 1, Busy: true},
		}, []int{4, 0}, nil},
		{"throughput-oriented: prefill and decode equal", 8, o, []Tenant{
			{Slot: 0, ID: "prefill", Tier: table.TierBestEffort, Role: table.RolePrefill, Weight: 1, Busy: true},
			{Slot: 1, ID: "decode", Tier: table.TierBestEffort, Role: table.RoleDecode, Weight: 1, Busy: true},
		}, []int{4, 4}, []uint64{0x0f, 0xf0}},
		{"TPOT-First: decode picks first, prefill the rest", 8, tp, []Tenant{
			{Slot: 0, ID: "prefill", Tier: table.TierBestEffort, Role: table.RolePrefill, Weight: 1, Busy: true},
			{Slot: 1, ID: "decode", Tier: table.TierBestEffort, Role: table.RoleDecode, Weight: 1, Busy: true},
		}, []int{2, 6}, []uint64{0xc0, 0x3f}},
		{"TPOT-First: decode guarantee placed first", 4, tp, []Tenant{
			{Slot: 0, ID: "prefill", Tier: table.TierBurstable, Role: table.RolePrefill, Weight: 1, Guarantee: 1, Busy: true},
			{Slot: 1, ID: "decode", Tier: table.TierBurstable, Role: table.RoleDecode, Weight: 1, Guarantee: 1, Busy: true},
		}, []int{1, 3}, []uint64{0x02, 0x0d}},
		{"TPOT-First: idle decode leaves all to prefill", 8, tp, []Tenant{
			{Slot: 0, ID: "prefill", Tier: table.TierBestEffort, Role: table.RolePrefill, Weight: 1, Busy: true},
			{Slot: 1, ID: "decode", Tier: table.TierBestEffort, Role: table.RoleDecode, Weight: 1},
		}, []int{8, 8}, nil},
		{"guarantees that no longer fit are cut, not overlapped", 4, o, []Tenant{
			{Slot: 0, ID: "a", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 3},
			{Slot: 1, ID: "b", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 3},
		}, []int{3, 1}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gs := groups(c.n, 8)
			d := Decide(gs, c.tenants, c.opts)
			checkInvariants(t, gs, c.tenants, d)
			for i, w := range c.want {
				if got := bits.OnesCount64(d.Grants[i].Groups); got != w {
					t.Errorf("%s: %d groups (%b, %q), want %d", c.tenants[i].ID, got, d.Grants[i].Groups, d.Grants[i].Reason, w)
				}
				if d.Grants[i].Reason == "" {
					t.Errorf("%s: no reason", c.tenants[i].ID)
				}
			}
			for i, m := range c.mask {
				if m != 0 && d.Grants[i].Groups != m {
					t.Errorf("%s: groups %08b, want %08b", c.tenants[i].ID, d.Grants[i].Groups, m)
				}
			}
		})
	}
}

func TestDecideStable(t *testing.T) {
	gs := groups(15, 8)
	ts := []Tenant{
		{Slot: 0, ID: "a", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: 0x7000},
		{Slot: 1, ID: "b", Tier: table.TierBestEffort, Weight: 1, Busy: true, Prev: 0x00f0},
		{Slot: 2, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Guarantee: 2, Prev: 0x0300, Pinned: true},
	}
	d := Decide(gs, ts, DefaultOptions())
	checkInvariants(t, gs, ts, d)
	if d.Grants[2].Groups != 0x0300 {
		t.Errorf("lc moved: %b", d.Grants[2].Groups)
	}
	if d.Grants[0].Groups&0x7000 != 0x7000 || d.Grants[1].Groups&0x00f0 != 0x00f0 {
		t.Errorf("busy tenants lost groups they had: a=%b b=%b", d.Grants[0].Groups, d.Grants[1].Groups)
	}
	// Deciding again from the result changes nothing.
	for i := range ts {
		ts[i].Prev = d.Grants[i].Groups
	}
	d2 := Decide(gs, ts, DefaultOptions())
	for i := range ts {
		if d2.Grants[i].Groups != d.Grants[i].Groups {
			t.Errorf("%s reshuffled: %b -> %b", ts[i].ID, d.Grants[i].Groups, d2.Grants[i].Groups)
		}
	}
	// One more best-effort tenant arriving moves as few groups as possible: the others only give some away.
	ts = append(ts, Tenant{Slot: 3, ID: "c", Tier: table.TierBestEffort, Weight: 1, Busy: true})
	d3 := Decide(gs, ts, DefaultOptions())
	checkInvariants(t, gs, ts, d3)
	for i := 0; i < 3; i++ {
		if d3.Grants[i].Groups&^d.Grants[i].Groups != 0 {
			t.Errorf("%s gained groups it did not have when sharing got tighter: %b -> %b", ts[i].ID, d.Grants[i].Groups, d3.Grants[i].Groups)
		}
	}
}

// TestDecideRandom checks the invariants on random mixes.
func TestDecideRandom(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for it := 0; it < 3000; it++ {
		n := 1 + r.Intn(20)
		gs := groups(n, uint32(4+r.Intn(8)))
		var ts []Tenant
		left := n
		for s := 0; s < 1+r.Intn(8); s++ {
			tier := table.Tier(r.Intn(3))
			g := 0
			if tier != table.TierBestEffort && left > 0 {
				g = r.Intn(left + 1)
				left -= g
			}
			ts = append(ts, Tenant{Slot: s, ID: fmt.Sprint("t", s), Tier: tier, Role: table.Role(r.Intn(3)), Weight: uint32(1 + r.Intn(4)),
				Guarantee: g, Lend: r.Intn(2) == 0, Busy: r.Intn(2) == 0, Prev: r.Uint64() & (1<<n - 1)})
		}
		o := DefaultOptions()
		if r.Intn(2) == 0 {
			o.Kind = TPOTFirst
		}
		d := Decide(gs, ts, o)
		checkInvariants(t, gs, ts, d)
	}
}

func TestRotation(t *testing.T) {
	o := DefaultOptions()
	ts := []Tenant{
		{Slot: 0, ID: "be", Tier: table.TierBestEffort, Weight: 2, Busy: true},
		{Slot: 1, ID: "idle", Tier: table.TierLatencyCritical, Weight: 1},
		{Slot: 2, ID: "lc", Tier: table.TierLatencyCritical, Weight: 1, Busy: true},
		{Slot: 3, ID: "bu", Tier: table.TierBurstable, Weight: 1, Busy: true},
		{Slot: 4, ID: "heavy", Tier: table.TierLatencyCritical, Weight: 100, Busy: true},
	}
	r := Rotation(ts, o)
	want := []Turn{{2, 20 * time.Millisecond}, {4, 50 * time.Millisecond}, {3, 10 * time.Millisecond}, {0, 10 * time.Millisecond}}
	if fmt.Sprint(r) != fmt.Sprint(want) {
		t.Fatalf("rotation %v, want %v", r, want)
	}
	o.Kind = TPOTFirst
	ts2 := []Tenant{
		{Slot: 0, ID: "p", Tier: table.TierBestEffort, Role: table.RolePrefill, Weight: 1, Busy: true},
		{Slot: 1, ID: "d", Tier: table.TierBestEffort, Role: table.RoleDecode, Weight: 1, Busy: true},
	}
	r2 := Rotation(ts2, o)
	if r2[0].Slot != 1 || r2[0].Quantum != 15*time.Millisecond || r2[1].Quantum != 5*time.Millisecond {
		t.Fatalf("TPOT-First rotation %v: decode must come first with a boosted quantum", r2)
	}
}

func TestParseKind(t *testing.T) {
	if k, err := ParseKind("tpot-first"); err != nil || k != TPOTFirst {
		t.Fatal(k, err)
	}
	_, err := ParseKind("fastest")
	if err == nil || !contains(err.Error(), `"fastest"`) || !contains(err.Error(), "throughput-oriented") {
		t.Fatalf("error must name value and allowed values: %v", err)
	}
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}
func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// BenchmarkDecide is one spatial decision of a GPU of 64 groups for n tenants of mixed tiers and weights (the first
// 16 burstable and latency-critical ones with a guarantee), half of them busy, one tenant's demand flipping each
// iteration, decided by one Decider as the scheduler's loop does. allocs/op must not grow with n (issue 28).
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{1, 2, 16, 64, 128, 256} {
		b.Run(fmt.Sprint("tenants=", n), func(b *testing.B) {
			gs := groups(64, 2)
			ts := benchTenants(n)
			o := DefaultOptions()
			var dc Decider
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				ts[i%n].Busy = !ts[i%n].Busy
				d := dc.Decide(gs, ts, o)
				for j := range ts {
					ts[j].Prev = d.Grants[j].Groups
				}
			}
		})
	}
}

func benchTenants(n int) []Tenant {
	ts := make([]Tenant, n)
	for i := range ts {
		ts[i] = Tenant{Slot: i, ID: fmt.Sprint(i), Tier: table.Tier(i % 3), Weight: uint32(1 + i%4), Busy: i%2 == 0}
		if ts[i].Tier != table.TierBestEffort && i < 16 {
			ts[i].Guarantee = 1
		}
	}
	return ts
}
