package table

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

func newTable(t testing.TB) *Table {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	tb, err := Create(dir)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { tb.Close() })
	if err := tb.SetGPUs([]GPUInfo{{Index: 0, UUID: "SIM-test-0", Name: "simulated GPU (test double)", SMCount: 132, MemTotal: 80 << 30}}); err != nil {
		t.Fatalf("SetGPUs: %v", err)
	}
	return tb
}

func TestCreateLayoutAndPermissions(t *testing.T) {
	tb := newTable(t)
	p := tb.Paths()
	for path, mode := range map[string]os.FileMode{p.Dir: 0o755 | os.ModeDir, p.Table(): 0o644, p.Doorbell(): 0o666,
		p.ClientsDir(): 0o700 | os.ModeDir, p.TenantsDir(): 0o755 | os.ModeDir} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, st.Mode(), mode)
		}
	}
	st, _ := os.Stat(p.Table())
	if st.Size() != TableSize {
		t.Errorf("table size %d, want %d", st.Size(), TableSize)
	}
	h := tb.Header()
	if h.Magic != TableMagic || h.ABIVersion != ABIVersion || h.State != TableReady || h.NGPUs != 1 {
		t.Errorf("header %+v", *h)
	}
	if tb.Doorbell() == nil || tb.Doorbell().Magic != DoorbellMagic {
		t.Error("doorbell not mapped")
	}
	// Create on an existing table opens it and keeps its content.
	if _, err := tb.Register(RegisterRequest{ID: "keep", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	t2, err := Create(p.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close()
	if _, ok := t2.Lookup("keep"); !ok {
		t.Error("second Create lost the registration")
	}
}

func TestOpenRefusesOtherVersionAndWritesNothing(t *testing.T) {
	tb := newTable(t)
	path := tb.Paths().Table()
	tb.Close()
	b, _ := os.ReadFile(path)
	(*Header)(unsafe.Pointer(&b[0])).ABIVersion = ABIVersion + 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	_, err := Open(filepath.Dir(path))
	if !errors.Is(err, ErrVersionMismatch) {
		t.Fatalf("Open of a version %d table: %v, want ErrVersionMismatch", ABIVersion+1, err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("ABI version %d", ABIVersion+1)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("speaks version %d", ABIVersion)) {
		t.Errorf("error does not say both versions: %v", err)
	}
	// Create must refuse too, not overwrite.
	if _, err := Create(filepath.Dir(path)); !errors.Is(err, ErrVersionMismatch) {
		t.Fatalf("Create over a foreign table: %v", err)
	}
	after, _ := os.ReadFile(path)
	if string(before) != string(after) {
		t.Error("a refused table was modified")
	}
}

func TestOpenRefusesCorrupt(t *testing.T) {
	for name, mutate := range map[string]func([]byte) []byte{
		"magic":     func(b []byte) []byte { b[0] ^= 0xff; return b },
		"truncated": func(b []byte) []byte { return b[:4096] },
		"geometry":  func(b []byte) []byte { (*Header)(unsafe.Pointer(&b[0])).MaxContainers = 7; return b },
		"state":     func(b []byte) []byte { (*Header)(unsafe.Pointer(&b[0])).State = TableInitialising; return b },
	} {
		t.Run(name, func(t *testing.T) {
			tb := newTable(t)
			path := tb.Paths().Table()
			tb.Close()
			b, _ := os.ReadFile(path)
			if err := os.WriteFile(path, mutate(b), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Open(filepath.Dir(path)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestRegisterLifecycle(t *testing.T) {
	tb := newTable(t)
	gen0 := tb.Generation()
	reg, err := tb.Register(RegisterRequest{ID: "c1", Tier: TierLatencyCritical, Role: RoleDecode, GPU: 0, Weight: 3,
		SMGroups: 2, SMs: 16, MemLimit: 1 << 30, Lend: true})
	if err != nil {
		t.Fatal(err)
	}
	if reg.State != SlotActive || reg.Gen == 0 || reg.SMs != 16 || reg.Flags != FlagLend || reg.HostTenant() {
		t.Errorf("registration %+v", reg)
	}
	if tb.Generation() == gen0 {
		t.Error("generation not bumped")
	}
	st, err := os.Stat(reg.ClientPagePath)
	if err != nil || st.Mode() != ClientPageMode || st.Size() != ClientPageSize {
		t.Fatalf("client page: %v %v", st, err)
	}
	cl, err := OpenClientPage(reg.ClientPagePath)
	if err != nil {
		t.Fatal(err)
	}
	if p := cl.Page(); p.Slot != uint32(reg.Slot) || p.SlotGen != reg.Gen || cString(p.ID[:]) != "c1" || p.MaxProcs != MaxProcs {
		t.Errorf("client page header slot=%d gen=%d id=%q", p.Slot, p.SlotGen, cString(p.ID[:]))
	}
	cl.Close()

	// Same ID: the existing registration and ErrExists.
	again, err := tb.Register(RegisterRequest{ID: "c1", Weight: 1})
	if !errors.Is(err, ErrExists) || again.Slot != reg.Slot || again.Gen != reg.Gen {
		t.Fatalf("re-register: %+v %v", again, err)
	}
	if got, ok := tb.Lookup("c1"); !ok || got.Slot != reg.Slot {
		t.Errorf("Lookup: %+v %v", got, ok)
	}
	if l := tb.List(); len(l) != 1 || l[0].ID != "c1" {
		t.Errorf("List: %+v", l)
	}
	if err := os.MkdirAll(reg.TenantDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := tb.Deregister("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(reg.ClientPagePath); !errors.Is(err, os.ErrNotExist) {
		t.Error("client page left behind")
	}
	if _, err := os.Stat(reg.TenantDir); !errors.Is(err, os.ErrNotExist) {
		t.Error("tenant dir left behind")
	}
	if _, ok := tb.Lookup("c1"); ok {
		t.Error("still registered")
	}
	if err := tb.Deregister("c1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second deregister: %v", err)
	}
	// The slot is reused with a new generation.
	reg2, err := tb.Register(RegisterRequest{ID: "c2", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if reg2.Slot == reg.Slot && reg2.Gen == reg.Gen {
		t.Error("slot reused without a new generation")
	}
}

func TestRegisterValidation(t *testing.T) {
	tb := newTable(t)
	for _, tc := range []struct {
		req  RegisterRequest
		want string
	}{
		{RegisterRequest{ID: "", Weight: 1}, "tenant id"},
		{RegisterRequest{ID: "../etc", Weight: 1}, "tenant id"},
		{RegisterRequest{ID: strings.Repeat("a", IDLen), Weight: 1}, "tenant id"},
		{RegisterRequest{ID: "a", Weight: 0}, "weight 0"},
		{RegisterRequest{ID: "a", Weight: 1, Tier: 9}, "tier 9"},
		{RegisterRequest{ID: "a", Weight: 1, GPU: MaxGPUs}, "gpu 16"},
		{RegisterRequest{ID: "a", Weight: 1, OwnerPID: 1 << 30}, "owner pid"},
	} {
		if _, err := tb.Register(tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want it to mention %q", tc.req, err, tc.want)
		}
	}
	if l := tb.List(); len(l) != 0 {
		t.Errorf("refused registrations left %d slots", len(l))
	}
	ents, _ := os.ReadDir(tb.Paths().ClientsDir())
	if len(ents) != 0 {
		t.Errorf("refused registrations left %d client pages", len(ents))
	}
}

func TestRegisterCheckAndPrepareRollBack(t *testing.T) {
	tb := newTable(t)
	if _, err := tb.Register(RegisterRequest{ID: "a", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	_, err := tb.Register(RegisterRequest{ID: "b", Weight: 1, Check: func(active *Active, r *RegisterRequest) error {
		for a := range active.All() {
			seen = append(seen, a.ID())
		}
		return errors.New("admission says no")
	}})
	if err == nil || err.Error() != "admission says no" || len(seen) != 1 || seen[0] != "a" {
		t.Fatalf("check: %v, saw %v", err, seen)
	}
	var prepared Registration
	_, err = tb.Register(RegisterRequest{ID: "b", Weight: 1, Prepare: func(reg Registration) error {
		prepared = reg
		if _, err := os.Stat(reg.ClientPagePath); err != nil {
			t.Errorf("client page missing during Prepare: %v", err)
		}
		if st := atomic.LoadUint32(&tb.Container(reg.Slot).State); st != SlotReserved {
			t.Errorf("slot state %d during Prepare, want RESERVED", st)
		}
		if err := os.MkdirAll(reg.TenantDir, 0o755); err != nil {
			t.Fatal(err)
		}
		return errors.New("cannot write quota file")
	}})
	if err == nil {
		t.Fatal("prepare error not returned")
	}
	if _, ok := tb.Lookup("b"); ok {
		t.Error("b registered after failed Prepare")
	}
	if _, err := os.Stat(prepared.ClientPagePath); !errors.Is(err, os.ErrNotExist) {
		t.Error("client page left after failed Prepare")
	}
	if _, err := os.Stat(prepared.TenantDir); !errors.Is(err, os.ErrNotExist) {
		t.Error("tenant dir left after failed Prepare")
	}
	if st := atomic.LoadUint32(&tb.Container(prepared.Slot).State); st != SlotFree {
		t.Errorf("slot state %d after rollback", st)
	}
}

// TestCheckSeesExactlyTheActiveSlots: the admission check is handed every active registration, with the fields the
// table holds, and no other: not a deregistered one (a freed slot's guarantee must not be counted), not the one
// being registered; at the last free slot as at the first (issue 28: Active reads them in place instead of copying).
func TestCheckSeesExactlyTheActiveSlots(t *testing.T) {
	tb := newTable(t)
	for i := 0; i < MaxContainers-1; i++ {
		req := RegisterRequest{ID: fmt.Sprint("t", i), Weight: 1, Tier: Tier(i % 3), Role: Role(i % 3), GPU: i % 4,
			SMGroups: uint32(i % 5), SMs: uint32(i%5) * 8, MemLimit: uint64(i) << 20}
		if _, err := tb.Register(req); err != nil {
			t.Fatal(err)
		}
	}
	check := func(stage string) {
		t.Helper()
		var seen []ActiveSlot
		var ids []string
		n := -1
		_, err := tb.Register(RegisterRequest{ID: "new", Weight: 1, Check: func(active *Active, r *RegisterRequest) error {
			n = active.Len()
			for a := range active.All() {
				seen, ids = append(seen, a), append(ids, a.ID())
			}
			for range active.All() {
				break // an enumeration stopped early ends cleanly
			}
			return errors.New("refused")
		}})
		if err == nil || err.Error() != "refused" {
			t.Fatalf("%s: %v", stage, err)
		}
		want := tb.List()
		if n != len(want) || len(seen) != len(want) {
			t.Fatalf("%s: Len %d, enumerated %d, want %d active", stage, n, len(seen), len(want))
		}
		for i, r := range want {
			a := seen[i]
			if ids[i] != r.ID || a.Slot != r.Slot || a.Tier != r.Tier || a.Role != r.Role || a.GPU != r.GPU ||
				a.SMGroups != r.SMGroups || a.SMs != r.SMs || a.MemLimit != r.MemLimit {
				t.Fatalf("%s: check saw %+v (%s), table holds %+v", stage, a, ids[i], r)
			}
		}
	}
	check("255 active")
	for i := 0; i < MaxContainers-1; i += 3 {
		if err := tb.Deregister(fmt.Sprint("t", i)); err != nil {
			t.Fatal(err)
		}
	}
	check("every third deregistered")
	if l := tb.List(); len(l) != MaxContainers-1-85 {
		t.Fatalf("%d active after deregistering 85", len(l))
	}
}

func TestTableFull(t *testing.T) {
	tb := newTable(t)
	for i := 0; i < MaxContainers; i++ {
		if _, err := tb.Register(RegisterRequest{ID: fmt.Sprintf("t%d", i), Weight: 1}); err != nil {
			t.Fatalf("register %d: %v", i, err)
		}
	}
	_, err := tb.Register(RegisterRequest{ID: "one-more", Weight: 1})
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "256") {
		t.Fatalf("full table: %v", err)
	}
}

// TestRecoverStaleReservation simulates a registrar killed after reserving a slot and creating the page.
func TestRecoverStaleReservation(t *testing.T) {
	tb := newTable(t)
	keep, err := tb.Register(RegisterRequest{ID: "keep", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := tb.Container(5)
	atomic.StoreUint32(&c.State, SlotReserved)
	putCString(c.ID[:], "dead")
	page := tb.Paths().ClientPage("dead")
	os.WriteFile(page, []byte("x"), 0o644)
	// A half-written ID equal to an active tenant's must not delete that tenant's page.
	c6 := tb.Container(6)
	atomic.StoreUint32(&c6.State, SlotDraining)
	putCString(c6.ID[:], "keep")
	n, err := tb.Recover()
	if err != nil || n != 2 {
		t.Fatalf("Recover: %d %v", n, err)
	}
	if atomic.LoadUint32(&c.State) != SlotFree || atomic.LoadUint32(&c6.State) != SlotFree {
		t.Error("stale slots not freed")
	}
	if _, err := os.Stat(page); !errors.Is(err, os.ErrNotExist) {
		t.Error("stale page not removed")
	}
	if _, err := os.Stat(keep.ClientPagePath); err != nil {
		t.Errorf("active tenant's page removed: %v", err)
	}
}

func TestHostTenantReaped(t *testing.T) {
	tb := newTable(t)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reg, err := tb.Register(RegisterRequest{ID: "host", Weight: 1, OwnerPID: cmd.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	if !reg.HostTenant() || reg.OwnerStart == 0 {
		t.Fatalf("not a host tenant: %+v", reg)
	}
	if ids, _ := tb.ReapDeadTenants(); len(ids) != 0 {
		t.Fatalf("reaped a live owner: %v", ids)
	}
	cmd.Process.Kill()
	cmd.Wait()
	ids, err := tb.ReapDeadTenants()
	if err != nil || len(ids) != 1 || ids[0] != "host" {
		t.Fatalf("ReapDeadTenants: %v %v", ids, err)
	}
	if _, err := os.Stat(reg.ClientPagePath); !errors.Is(err, os.ErrNotExist) {
		t.Error("page of reaped tenant left")
	}
}

func TestGPUsAndSplit(t *testing.T) {
	tb := newTable(t)
	g := tb.GPUs()
	if len(g) != 1 || g[0].UUID != "SIM-test-0" || g[0].Split.Published || len(g[0].Split.Groups) != 15 || g[0].Split.Remainder != 12 {
		t.Fatalf("GPUs: %+v", g)
	}
	ok, err := tb.PublishSplit(0, Split{MinSize: 16, Alignment: 8, Groups: []uint32{16, 16, 16, 16, 16, 16, 16, 16}, Remainder: 4})
	if !ok || err != nil {
		t.Fatalf("PublishSplit: %v %v", ok, err)
	}
	if ok, _ := tb.PublishSplit(0, Split{Groups: []uint32{8}}); ok {
		t.Error("second PublishSplit won")
	}
	g = tb.GPUs()
	if !g[0].Split.Published || len(g[0].Split.Groups) != 8 || g[0].Split.TotalSMs() != 128 {
		t.Errorf("published split %+v", g[0].Split)
	}
	// Rediscovery with the same UUID keeps the split; a new UUID resets the entry.
	if err := tb.SetGPUs([]GPUInfo{{Index: 0, UUID: "SIM-test-0", SMCount: 132, MemTotal: 80 << 30}}); err != nil {
		t.Fatal(err)
	}
	if !tb.GPUs()[0].Split.Published {
		t.Error("rediscovery dropped the split")
	}
	if err := tb.SetGPUs([]GPUInfo{{Index: 0, UUID: "SIM-other", SMCount: 132}, {Index: 1, UUID: "SIM-two", SMCount: 64}}); err != nil {
		t.Fatal(err)
	}
	g = tb.GPUs()
	if len(g) != 2 || g[0].Split.Published || g[1].SMCount != 64 {
		t.Errorf("after new GPUs: %+v", g)
	}
	if err := tb.SetGPUs([]GPUInfo{{Index: 3, UUID: "x"}}); err == nil {
		t.Error("out-of-order GPU index accepted")
	}
}

func TestEstimateSplit(t *testing.T) {
	for _, tc := range []struct{ sms, min, groups, rem uint32 }{
		{132, 8, 15, 12}, {128, 8, 16, 0}, {108, 8, 12, 12}, {7, 8, 0, 7}, {1000, 8, 64, 488},
	} {
		s := EstimateSplit(tc.sms, tc.min)
		if uint32(len(s.Groups)) != tc.groups || s.Remainder != tc.rem || s.TotalSMs()+s.Remainder != tc.sms {
			t.Errorf("EstimateSplit(%d,%d) = %d groups rem %d", tc.sms, tc.min, len(s.Groups), s.Remainder)
		}
	}
}

func TestLeader(t *testing.T) {
	tb := newTable(t)
	if tb.LeaderAlive(time.Second) {
		t.Fatal("leader alive in a new table")
	}
	l, err := tb.SetLeader(os.Getpid())
	if err != nil || l.PID != os.Getpid() || l.Epoch != 1 {
		t.Fatalf("SetLeader: %+v %v", l, err)
	}
	if !tb.LeaderAlive(time.Second) {
		t.Error("live leader not alive")
	}
	atomic.StoreUint64(&tb.Header().SchedHeartbeatNs, MonotonicNs()-uint64(5*time.Second))
	if tb.LeaderAlive(time.Second) {
		t.Error("stale heartbeat reported alive")
	}
	tb.Heartbeat()
	if !tb.LeaderAlive(time.Second) {
		t.Error("heartbeat did not refresh")
	}
	tb.ClearLeader(os.Getpid())
	if tb.Leader().PID != 0 || tb.Leader().Epoch != 1 {
		t.Errorf("after clear: %+v", tb.Leader())
	}
}

func TestLeaderTakeoverResetsHalfPublishedSplit(t *testing.T) {
	tb := newTable(t)
	atomic.StoreUint32(&tb.GPU(0).SplitState, SplitPublishing) // a leader died mid-publish
	if _, err := tb.SetLeader(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if ok, err := tb.PublishSplit(0, Split{MinSize: 8, Groups: []uint32{8, 8}}); !ok || err != nil {
		t.Fatalf("split not publishable after takeover: %v %v", ok, err)
	}
}

// Create removes the temporaries of the files it writes under the table lock (the table, the doorbell), left by a
// creator that died, and other writers' temporaries only once they are older than any live write: other files of the run directory (the containers' preload list, quota and
// workload files) are written atomically by processes that do not take that lock, and a temporary of theirs may be
// in flight (CI run 48: a container's ld.so.preload rename failed because a concurrent Create had removed it).
func TestCreateRemovesStaleTemporaries(t *testing.T) {
	tb := newTable(t)
	dir := tb.Paths().Dir
	stale := []string{filepath.Join(dir, ".table.tmp-123"), filepath.Join(dir, ".doorbell.tmp-456")}
	inFlight := []string{filepath.Join(dir, ".ld.so.preload.tmp-789"), filepath.Join(dir, ".detshare-cdi.json.tmp-1")}
	// another writer's temporary older than any live write: its writer died, so it goes too
	dead := filepath.Join(dir, ".ld.so.preload.tmp-dead")
	for _, f := range append(append([]string{dead}, stale...), inFlight...) {
		if err := os.WriteFile(f, []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleTemporaryAge)
	if err := os.Chtimes(dead, old, old); err != nil {
		t.Fatal(err)
	}
	stale = append(stale, dead)
	t2, err := Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	t2.Close()
	for _, f := range stale {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale temporary %s left", filepath.Base(f))
		}
	}
	for _, f := range inFlight {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("another writer's temporary %s removed: %v", filepath.Base(f), err)
		}
	}
}

// The SMs left over run with the last group: RunSizes counts them there and leaves the split itself alone.
func TestRunSizesPutTheRemainderInTheLastGroup(t *testing.T) {
	s := EstimateSplit(132, 8)
	got := s.RunSizes()
	if len(got) != 15 || got[14] != 20 || got[0] != 8 || s.Groups[14] != 8 || s.Remainder != 12 {
		t.Fatalf("RunSizes of %+v = %v, want 14 groups of 8 and one of 20 (the split unchanged)", s, got)
	}
	var sum uint32
	for _, g := range got {
		sum += g
	}
	if sum != 132 {
		t.Fatalf("RunSizes sum to %d SMs, want all 132", sum)
	}
	if r := (Split{}).RunSizes(); len(r) != 0 {
		t.Fatalf("RunSizes of an empty split = %v", r)
	}
}
