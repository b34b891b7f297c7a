package table

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestGrantPublishRead(t *testing.T) {
	tb := newTable(t)
	reg, err := tb.Register(RegisterRequest{ID: "g", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	g0, err := tb.ReadGrant(reg.Slot)
	if err != nil || g0.Mode != ModeNone || g0.Groups != 0 {
		t.Fatalf("initial grant %+v %v", g0, err)
	}
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 0b1011, SMs: 24, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	g1, err := tb.ReadGrant(reg.Slot)
	if err != nil || g1.Groups != 0b1011 || g1.SMs != 24 || g1.Mode != ModeSpatial || g1.Epoch != g0.Epoch+1 || g1.Ns == 0 {
		t.Fatalf("grant %+v %v", g1, err)
	}
	if tb.GrantEpoch(reg.Slot) != g1.Epoch {
		t.Error("GrantEpoch disagrees")
	}
	if tb.GPU(0).GrantChanges != 1 {
		t.Errorf("grant_changes %d", tb.GPU(0).GrantChanges)
	}
	if err := tb.PublishGrant(7, Grant{}); err == nil {
		t.Error("grant to a free slot accepted")
	}
	// A leader that died mid-write leaves grant_seq odd: readers give up (bounded) and the next leader completes it.
	c := tb.Container(reg.Slot)
	atomic.AddUint32(&c.GrantSeq, 1)
	if _, err := tb.ReadGrant(reg.Slot); !errors.Is(err, ErrGrantBusy) {
		t.Fatalf("read of a stuck seqlock: %v", err)
	}
	defer func(d time.Duration) { grantTakeover = d }(grantTakeover)
	grantTakeover = 20 * time.Millisecond
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 1, SMs: 8, Mode: ModeSpatial}); err != nil {
		t.Fatal(err)
	}
	if g, err := tb.ReadGrant(reg.Slot); err != nil || g.Groups != 1 {
		t.Fatalf("after recovery %+v %v", g, err)
	}
	// A grant meant for an earlier generation of the slot is dropped.
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 2, Mode: ModeSpatial, Gen: reg.Gen + 1}); err == nil {
		t.Error("grant for another generation published")
	}
	if err := tb.PublishGrant(reg.Slot, Grant{Groups: 2, Mode: ModeSpatial, Gen: reg.Gen}); err != nil {
		t.Error(err)
	}
	if g, _ := tb.ReadGrant(reg.Slot); g.Groups != 2 {
		t.Errorf("grant with the right generation not published: %+v", g)
	}
}

// TestGrantWritersSerialise: registrations resetting grants and a scheduler publishing to the same slots at the
// same time never leave the seqlock odd or a torn grant (both writers take the seqlock's writer side by CAS).
func TestGrantWritersSerialise(t *testing.T) {
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "w0", Weight: 1})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := uint64(1); ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			tb.PublishGrant(reg.Slot, Grant{Groups: n | 1, SMs: 8 * uint32(bitsOn(n|1)), Mode: ModeSpatial})
		}
	}()
	c := tb.Container(reg.Slot)
	for i := 0; i < 20000; i++ {
		publishGrant(c, Grant{Mode: ModeNone})
		g, err := ReadContainerGrant(c)
		if err == nil && g.Mode == ModeSpatial && g.SMs != 8*uint32(bitsOn(g.Groups)) {
			t.Fatalf("torn grant %+v", g)
		}
	}
	close(stop)
	<-done
	if s := atomic.LoadUint32(&c.GrantSeq); s&1 != 0 {
		t.Fatalf("grant_seq left odd: %d", s)
	}
}

func bitsOn(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// TestGrantSeqlockConsistent races a writer against readers: every read must be a grant that was published as a
// whole (SMs == 8 * popcount(groups) and mode matches the parity used by the writer).
func TestGrantSeqlockConsistent(t *testing.T) {
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "race", Weight: 1})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad, reads atomic.Int64
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				g, err := tb.ReadGrant(reg.Slot)
				if err != nil {
					continue
				}
				reads.Add(1)
				n := uint32(0)
				for x := g.Groups; x != 0; x &= x - 1 {
					n++
				}
				wantMode := ModeSpatial
				if g.Groups&1 == 0 {
					wantMode = ModeTemporal
				}
				if g.Mode == ModeNone && g.Groups == 0 {
					continue
				}
				if g.SMs != 8*n || g.Mode != wantMode {
					bad.Add(1)
				}
			}
		}()
	}
	for i := uint64(1); i < 20000; i++ {
		groups := i * 0x9E3779B97F4A7C15
		n := uint32(0)
		for x := groups; x != 0; x &= x - 1 {
			n++
		}
		mode := ModeSpatial
		if groups&1 == 0 {
			mode = ModeTemporal
		}
		if err := tb.PublishGrant(reg.Slot, Grant{Groups: groups, SMs: 8 * n, Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d torn grant reads out of %d", bad.Load(), reads.Load())
	}
	if reads.Load() == 0 {
		t.Fatal("no reads")
	}
}

func TestFutexWaitWakeTimeout(t *testing.T) {
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "f", Weight: 1})
	seen := tb.GrantEpoch(reg.Slot)
	start := time.Now()
	changed, err := tb.WaitGrantChange(reg.Slot, seen, 50*time.Millisecond)
	if err != nil || changed || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("timeout wait: changed=%v err=%v after %v", changed, err, time.Since(start))
	}
	if _, err := FutexWait(new(uint32), 0, 0); err == nil {
		t.Error("unbounded wait accepted")
	}
	done := make(chan bool)
	go func() {
		ch, _ := tb.WaitGrantChange(reg.Slot, seen, 10*time.Second)
		done <- ch
	}()
	time.Sleep(20 * time.Millisecond)
	start = time.Now()
	tb.PublishGrant(reg.Slot, Grant{Groups: 1, SMs: 8, Mode: ModeSpatial})
	select {
	case ch := <-done:
		if !ch {
			t.Error("woken without change")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by PublishGrant")
	}
}

// TestDoorbellAcrossProcesses: a child process (another mapping of the same file) rings the doorbell; the parent
// blocked in WaitDoorbell wakes up.
func TestDoorbellAcrossProcesses(t *testing.T) {
	if os.Getenv("DETSHARE_TEST_RING") != "" {
		tb, err := Open(os.Getenv("DETSHARE_TEST_RING"))
		if err != nil {
			os.Exit(3)
		}
		time.Sleep(100 * time.Millisecond)
		tb.RingDoorbell()
		os.Exit(0)
	}
	tb := newTable(t)
	seen := tb.DoorbellSeq()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDoorbellAcrossProcesses$")
	cmd.Env = append(os.Environ(), "DETSHARE_TEST_RING="+tb.Paths().Dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	seq, changed, err := tb.WaitDoorbell(seen, 10*time.Second)
	if err != nil || !changed || seq != seen+1 {
		t.Fatalf("doorbell: seq %d changed %v err %v", seq, changed, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
}

func TestTokenPublishWait(t *testing.T) {
	tb := newTable(t)
	reg, _ := tb.Register(RegisterRequest{ID: "tok", Weight: 1})
	tok := tb.ReadToken(0)
	if tok.Holder != -1 {
		t.Fatalf("initial holder %d", tok.Holder)
	}
	got := make(chan Token)
	go func() {
		tk, _ := tb.WaitToken(0, tok.Seq, 10*time.Second)
		got <- tk
	}()
	time.Sleep(10 * time.Millisecond)
	if err := tb.PublishToken(0, reg.Slot, 12345); err != nil {
		t.Fatal(err)
	}
	select {
	case tk := <-got:
		if tk.Holder != reg.Slot || tk.HolderGen != reg.Gen || tk.DeadlineNs != 12345 || tk.Seq != tok.Seq+1 {
			t.Errorf("token %+v", tk)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("token waiter not woken")
	}
	if err := tb.PublishToken(0, MaxContainers, 0); err == nil {
		t.Error("bad slot accepted")
	}
}

// BenchmarkReadContainerGrant measures the convenience form, (Grant, error) by value.
func BenchmarkReadContainerGrant(b *testing.B) {
	tb := newTable(b)
	reg, _ := tb.Register(RegisterRequest{ID: "bench", Weight: 1})
	tb.PublishGrant(reg.Slot, Grant{Groups: 0xff, SMs: 64, Mode: ModeSpatial})
	c := tb.Container(reg.Slot)
	b.ResetTimer()
	var sink uint64
	for i := 0; i < b.N; i++ {
		g, _ := ReadContainerGrant(c)
		sink += g.Groups
	}
	if sink == 0 {
		b.Fatal("no grant read")
	}
}

// BenchmarkReadGrant measures the fast-path read, LoadGrant (seqlock, fills a caller's Grant; inlined).
func BenchmarkReadGrant(b *testing.B) {
	tb := newTable(b)
	reg, _ := tb.Register(RegisterRequest{ID: "bench", Weight: 1})
	tb.PublishGrant(reg.Slot, Grant{Groups: 0xff, SMs: 64, Mode: ModeSpatial})
	c := tb.Container(reg.Slot)
	b.ResetTimer()
	var sink uint64
	var g Grant
	for i := 0; i < b.N; i++ {
		if LoadGrant(c, &g) {
			sink += g.Groups
		}
	}
	if sink == 0 {
		b.Fatal("no grant read")
	}
}

func BenchmarkGrantEpoch(b *testing.B) {
	tb := newTable(b)
	reg, _ := tb.Register(RegisterRequest{ID: "bench", Weight: 1})
	b.ResetTimer()
	var sink uint32
	for i := 0; i < b.N; i++ {
		sink += tb.GrantEpoch(reg.Slot)
	}
	_ = sink
}

func BenchmarkPublishGrant(b *testing.B) {
	tb := newTable(b)
	reg, _ := tb.Register(RegisterRequest{ID: "bench", Weight: 1})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tb.PublishGrant(reg.Slot, Grant{Groups: uint64(i), SMs: 8, Mode: ModeSpatial})
	}
}

// BenchmarkRegister measures a register + deregister pair (flock, slot, client page create/remove).
func BenchmarkRegister(b *testing.B) {
	tb := newTable(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tb.Register(RegisterRequest{ID: "bench", Weight: 1}); err != nil {
			b.Fatal(err)
		}
		if err := tb.Deregister("bench"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestReadOnlyViewRingsDoorbell(t *testing.T) {
	tb := newTable(t)
	ro, err := OpenReadOnly(tb.Paths().Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	seq := tb.DoorbellSeq()
	ro.RingDoorbell()
	if tb.DoorbellSeq() != seq+1 {
		t.Fatalf("doorbell %d, want %d", tb.DoorbellSeq(), seq+1)
	}
}
