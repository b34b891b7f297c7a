package libdetshare_test

import (
	"bufio"
	"fmt"
	"io"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/internal/table"
)

// h100Split is the split the scheduler publishes for the simulated GPU: 15 groups of 8 SMs and 12 left over, as
// on an H100 (DESIGN.md §2).
func h100Split() table.Split {
	g := make([]uint32, 15)
	for i := range g {
		g[i] = 8
	}
	return table.Split{MinSize: 8, Alignment: 8, Groups: g, Remainder: 12}
}

// playScheduler publishes the split and keeps the scheduler heartbeat fresh for the test's duration (the test
// plays the scheduler leader).
func (e *env) playScheduler() {
	t := e.t
	if _, err := e.tbl.PublishSplit(0, h100Split()); err != nil {
		t.Fatalf("publish split: %v", err)
	}
	if err := e.tbl.SetMPS(0, table.MPSRunning, table.ModeSpatial, ""); err != nil {
		t.Fatalf("set MPS: %v", err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	e.tbl.Heartbeat()
	go func() {
		defer close(done)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				e.tbl.Heartbeat()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

func (e *env) grant(mode uint32, groups uint64) {
	e.t.Helper()
	sms := uint32(0)
	for i := 0; i < 15; i++ {
		if groups&(1<<i) != 0 {
			sms += 8
		}
	}
	if err := e.tbl.PublishGrant(e.reg.Slot, table.Grant{Groups: groups, SMs: sms, Mode: mode}); err != nil {
		e.t.Fatalf("publish grant: %v", err)
	}
}

// giveToken hands GPU 0's temporal token to to's tenant for an hour (tests move it on themselves).
func (e *env) giveToken(to *env) {
	e.t.Helper()
	if err := e.tbl.PublishToken(0, to.reg.Slot, table.MonotonicNs()+uint64(time.Hour)); err != nil {
		e.t.Fatalf("publish token: %v", err)
	}
}

// launchesAtOnce runs one kernel in e's tenant and fails unless it ran without waiting for anything (no queue delay
// recorded on its client page); what names the situation in the failure.
func (e *env) launchesAtOnce(what string) result {
	e.t.Helper()
	r := e.run("ds_probe_rt", "init", "launch:1")
	if r.get(e.t, "launch", "ok") != "1" {
		e.t.Fatalf("%s: the kernel did not run: %v", what, r.lines)
	}
	if d := atomic.LoadUint64(&e.client.Page().QueueDelayNs); d != 0 {
		e.t.Fatalf("%s: waited %v, want no wait", what, time.Duration(d))
	}
	return r
}

// held runs the probe's steps up to their first "pause", lets the rest start (work the test expects the library to
// hold back), calls meanwhile, which must release it, and returns what the probe printed and the queue delay the
// library recorded for e's tenant.
func (e *env) held(meanwhile func(), steps ...string) (result, time.Duration) {
	p := e.start("ds_probe_rt", steps...)
	p.until()
	p.resume()
	meanwhile()
	return p.finish(), time.Duration(atomic.LoadUint64(&e.client.Page().QueueDelayNs))
}

// heldLaunch is held for one kernel launch, which must succeed once released; it returns the queue delay.
func (e *env) heldLaunch(meanwhile func()) time.Duration {
	e.t.Helper()
	r, d := e.held(meanwhile, "init", "pause", "launch:1")
	if r.get(e.t, "launch", "ok") != "1" {
		e.t.Fatalf("the held launch did not succeed: %v", r.lines)
	}
	return d
}

// stepper runs a probe whose "pause" steps wait for the test.
type stepper struct {
	t     testing.TB
	cmd   *exec.Cmd
	in    io.WriteCloser
	sc    *bufio.Scanner
	lines []string
}

func (e *env) start(prog string, steps ...string) *stepper {
	e.t.Helper()
	return e.startCmd(exec.Command(need(e.t, "tests/"+prog), steps...))
}

// startCmd starts cmd (a probe, or a command that execs one) in the environment as a stepper.
func (e *env) startCmd(cmd *exec.Cmd) *stepper {
	t := e.t
	t.Helper()
	cmd.Env = e.vars
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &stepper{t: t, cmd: cmd, in: in, sc: bufio.NewScanner(out)}
}

// until reads output up to the next "paused" (or the end) and returns the lines read.
func (s *stepper) until() result {
	s.t.Helper()
	var got []string
	for s.sc.Scan() {
		l := s.sc.Text()
		if l == "paused" {
			break
		}
		got = append(got, l)
	}
	s.lines = append(s.lines, got...)
	return parse(strings.Join(got, "\n"))
}

func (s *stepper) resume() {
	s.t.Helper()
	if _, err := io.WriteString(s.in, "\n"); err != nil {
		s.t.Fatalf("resume: %v", err)
	}
}

// under publishes grant and lets the paused probe run to its next pause (or, for the last of n phases, to its end);
// phase 0 only reads what the probe printed before its first pause.
func (s *stepper) under(e *env, grant uint64, phase, n int) result {
	s.t.Helper()
	if phase > 0 {
		e.grant(table.ModeSpatial, grant)
		s.resume()
	}
	if phase == n-1 {
		return s.finish()
	}
	return s.until()
}

func (s *stepper) finish() result {
	s.t.Helper()
	r := s.until()
	s.in.Close()
	if err := s.cmd.Wait(); err != nil {
		s.t.Fatalf("probe: %v\n%s", err, strings.Join(s.lines, "\n"))
	}
	return r
}

// groupsOf parses "groups=0,1,2" into a set.
func groupsOf(t testing.TB, r result, step string) map[int]bool {
	t.Helper()
	if rc := r.get(t, step, "rc"); rc != "0" {
		t.Fatalf("%s failed: rc %s", step, rc)
	}
	g := map[int]bool{}
	for _, x := range strings.Split(r.get(t, step, "groups"), ",") {
		n, err := strconv.Atoi(x)
		if err != nil {
			t.Fatalf("bad groups %q", r.get(t, step, "groups"))
		}
		g[n] = true
	}
	return g
}

// groupsOfEach is groupsOf for every line of step, in order (groupsOf reads the last one).
func groupsOfEach(t testing.TB, r result, step string) []map[int]bool {
	t.Helper()
	var out []map[int]bool
	for _, l := range r.order {
		if l.step == step {
			out = append(out, groupsOf(t, result{steps: map[string]map[string]string{step: l.kv}}, step))
		}
	}
	return out
}

// remainderBlocks are the 8-SM blocks (as groupsOf numbers them) of the 12 SMs the split leaves over, SMs 120-131,
// which run with the last group (14).
const remainderBlocks = 1<<15 | 1<<16

func within(got map[int]bool, mask uint64) bool {
	for g := range got {
		if g >= 64 || mask&(1<<g) == 0 {
			return false
		}
	}
	return true
}

// Two tenants' kernels run on disjoint SMs exactly as granted, on both driver paths and with graph capture.
func TestTwoTenantsRunOnDisjointSMsAsGranted(t *testing.T) {
	a := newEnv(t, true)
	a.vars = append(a.vars, "DETSHARE_SIMGPU_MPS=1") // several processes at once, as under MPS
	a.withTenant(0, "")
	b := a.another(0)
	a.playScheduler()
	a.grant(table.ModeSpatial, 0b11)     // groups 0-1: SMs 0-15
	b.grant(table.ModeSpatial, 0b111100) // groups 2-5: SMs 16-47
	pa := a.start("ds_probe_rt", "init", "stream", "smid:256", "smid:64", "capture:64", "graph")
	pb := b.start("ds_probe_lcuda", "init", "smid:256", "stream", "smid:256")
	ra, rb := pa.finish(), pb.finish()
	ga, gb := groupsOf(t, ra, "smid"), groupsOf(t, rb, "smid")
	if !within(ga, 0b11) || len(ga) != 2 {
		t.Errorf("tenant A ran on groups %v, granted exactly {0,1}", ga)
	}
	if !within(gb, 0b111100) || len(gb) != 4 {
		t.Errorf("tenant B ran on groups %v, granted exactly {2,3,4,5}", gb)
	}
	if n := ra.num(t, "smid", "distinct"); n != 16 {
		t.Errorf("tenant A used %d distinct SMs, its grant has 16", n)
	}
	if gg := groupsOf(t, ra, "graph"); !within(gg, 0b11) {
		t.Errorf("a graph captured under the grant ran on groups %v, outside {0,1}", gg)
	}
}

// The SMs the split leaves over (12 of 132) run with the last group: a tenant granted group 14 runs on its 8 SMs and
// the remainder (SMs 112-131), one granted group 13 on its 8 SMs only, and two tenants so granted never share an SM.
// Without it those 12 SMs sat idle under every grant short of the whole GPU (integration/gpu/remainder.sh measured
// that the driver makes such contexts).
func TestLastGroupRunsWithTheRemainder(t *testing.T) {
	a := newEnv(t, true)
	a.vars = append(a.vars, "DETSHARE_SIMGPU_MPS=1")
	a.withTenant(0, "")
	b := a.another(0)
	a.playScheduler()
	a.grant(table.ModeSpatial, 1<<14)
	b.grant(table.ModeSpatial, 1<<13)
	pa := a.start("ds_probe_rt", "init", "smid:256", "stream", "capture:64", "graph")
	pb := b.start("ds_probe_lcuda", "init", "smid:256")
	ra, rb := pa.finish(), pb.finish()
	if sms, n := ra.get(t, "smid", "sms"), ra.num(t, "smid", "distinct"); sms != "112-131" || n != 20 {
		t.Errorf("granted the last group: ran on SMs %s (%d distinct), want 112-131, the group and the remainder", sms, n)
	}
	if gg := groupsOf(t, ra, "graph"); !within(gg, 1<<14|remainderBlocks) {
		t.Errorf("granted the last group: a graph ran on groups %v, outside the group and the remainder", gg)
	}
	if sms, n := rb.get(t, "smid", "sms"), rb.num(t, "smid", "distinct"); sms != "104-111" || n != 8 {
		t.Errorf("granted group 13: ran on SMs %s (%d distinct), want 104-111", sms, n)
	}
}

// A kernel the grant's physical stream refuses (a cooperative launch with more blocks than the grant has SMs) runs
// where the application asked, once what the physical stream held has finished, and its stream runs unconfined from
// then on (said once in the log): the slow path after a refusal, which works on the logical stream the launch looked
// up (ds_launch_retry, ds_launch_unconfinable).
func TestRefusedKernelRunsOnTheApplicationStreamAndStaysUnconfined(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11) // groups 0-1: 16 SMs
	p := e.start("ds_probe_rt", "init", "stream", "smid:64", "pause", "coopsmid:64", "smid:64")
	before := p.until()
	if g := groupsOf(t, before, "smid"); !within(g, 0b11) {
		t.Fatalf("before the refusal the stream's kernels ran on groups %v, outside {0,1}", g)
	}
	p.resume()
	after := p.finish()
	if g := groupsOf(t, after, "coopsmid"); within(g, 0b11) {
		t.Errorf("the cooperative launch of 64 blocks ran on groups %v: it cannot fit the 16 SMs granted, so it "+
			"should have run on the application's stream (every SM)", g)
	}
	if g := groupsOf(t, after, "smid"); within(g, 0b11) {
		t.Errorf("after the refusal the stream's next kernel ran on groups %v: the stream should run unconfined", g)
	}
	log := strings.Join(p.lines, "\n")
	if n := strings.Count(log, "could not run on its green stream"); n != 1 {
		t.Errorf("the refusal was logged %d times, want once:\n%s", n, log)
	}
}

// A best-effort tenant expands to what is idle and shrinks at its next kernel boundary when the grant changes;
// results stay bit-identical with the library, without it, and under grant changes.
func TestBestEffortExpandsAndShrinksAtKernelBoundary(t *testing.T) {
	be := newEnv(t, true).withTenant(0, "")
	be.playScheduler()
	be.grant(table.ModeSpatial, 0x7fff) // all 15 groups: nothing to confine
	p := be.start("ds_probe_rt", "init", "stream", "smid:132", "axpy:50", "pause", "smid:132", "axpy:50",
		"pause", "smid:132", "axpy:50")
	r1 := p.until()
	if n := r1.num(t, "smid", "distinct"); n < 120 {
		t.Errorf("with every group granted the tenant used only %d SMs", n)
	}
	be.grant(table.ModeSpatial, 0x7ff0) // a latency-critical tenant took groups 0-3
	p.resume()
	r2 := p.until()
	g2 := groupsOf(t, r2, "smid")
	if !within(g2, 0x7ff0|remainderBlocks) || len(g2) != 13 {
		t.Errorf("after shrinking to groups 4-14 (and the SMs left over) the next kernel ran on groups %v", g2)
	}
	be.grant(table.ModeSpatial, 0x7fff) // idle again: expand
	p.resume()
	r3 := p.finish()
	if g3 := groupsOf(t, r3, "smid"); !g3[0] || !g3[3] {
		t.Errorf("after expanding back the next kernel ran on groups %v (no group 0-3)", g3)
	}
	bare := newEnv(t, false).run("ds_probe_rt", "init", "stream", "axpy:50")
	want := bare.get(t, "axpy", "hash")
	for i, r := range []result{r1, r2, r3} {
		if got := r.get(t, "axpy", "hash"); got != want {
			t.Errorf("axpy result %d under the library = %s, without it %s", i, got, want)
		}
	}
}

// Temporal mode: a tenant without the GPU token waits for it; with the scheduler gone it runs (fail-static).
func TestTemporalTokenSerialisesAndFailsStatic(t *testing.T) {
	a := newEnv(t, true).withTenant(0, "")
	b := a.another(0)
	a.playScheduler()
	a.grant(table.ModeTemporal, 0)
	b.grant(table.ModeTemporal, 0)
	a.giveToken(a)
	pb := b.start("ds_probe_rt", "init", "pause", "launch:1")
	pb.until()
	pb.resume()
	// B must be blocked: nothing reaches the client page's launch count... until the token moves to B
	time.Sleep(300 * time.Millisecond)
	if d := atomic.LoadUint64(&b.client.Page().QueueDelayNs); d != 0 {
		t.Fatalf("queue delay recorded before B got the token: %d", d)
	}
	// ... and B stays busy while it waits, well past its 20 ms idle window: marked idle, it would drop out of the
	// scheduler's rotation of busy tenants and never be given the token (seen on the H100).
	if d := atomic.LoadUint32(&b.client.Page().Demand); d != 1 {
		t.Fatalf("B's demand is %d while it waits for the token, want 1 (busy)", d)
	}
	if err := a.tbl.PublishToken(0, b.reg.Slot, table.MonotonicNs()+uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	r := pb.finish()
	if r.get(t, "launch", "ok") != "1" {
		t.Fatalf("B's kernel: %v", r.lines)
	}
	if d := atomic.LoadUint64(&b.client.Page().QueueDelayNs); d < uint64(200*time.Millisecond) {
		t.Errorf("B waited %v for the token, want >= 200ms (it must have waited)", time.Duration(d))
	}
	// the scheduler is gone (no heartbeat) while another tenant holds the token: B runs instead of hanging
	x := newEnv(t, true).withTenant(0, "")
	y := x.another(0)
	x.grant(table.ModeTemporal, 0)
	y.grant(table.ModeTemporal, 0)
	if err := x.tbl.PublishToken(0, x.reg.Slot, table.MonotonicNs()+uint64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	r2 := y.run("ds_probe_rt", "init", "launch:1")
	if r2.get(t, "launch", "ok") != "1" {
		t.Fatalf("without a scheduler the tenant did not run: %v", r2.lines)
	}
	if !strings.Contains(strings.Join(r2.lines, "\n"), "running unthrottled (fail-static)") {
		t.Errorf("no log line saying it runs unthrottled: %v", r2.lines)
	}
}

// An unrestricted grant (share_overlap on a GPU without MPS, nobody latency-critical: policy.TemporalTimeSliced)
// launches at once while another tenant holds the token: the driver time-slices the two, nobody waits for a turn.
// Its neighbour with a temporal grant still waits (the token is what that grant means).
func TestUnrestrictedGrantRunsBesideTheTokenHolder(t *testing.T) {
	holder := newEnv(t, true).withTenant(0, "")
	free := holder.another(0)
	waits := holder.another(0)
	holder.playScheduler()
	holder.grant(table.ModeTemporal, 0)
	free.grant(table.ModeUnrestricted, 0x7fff)
	waits.grant(table.ModeTemporal, 0)
	holder.giveToken(holder)
	r := free.launchesAtOnce("a tenant with an unrestricted grant, the token held by another")
	if strings.Contains(strings.Join(r.lines, "\n"), "fail-static") {
		t.Errorf("it ran by failing static, not by its grant: %v", r.lines)
	}
	if d := waits.heldLaunch(func() { time.Sleep(200 * time.Millisecond); holder.giveToken(waits) }); d < 150*time.Millisecond {
		t.Errorf("a temporal neighbour waited %v for the token, want >= 150ms", d)
	}
}

// Temporal mode, latency-critical tenant: it launches at once while a tenant the scheduler gates (a lower tier)
// holds the token (waiting for the hand-over would add a round trip to every request), and waits its turn behind
// another latency-critical holder. The attack side: a best-effort tenant is never let through this way, nor is one
// that claimed latency-critical but is scheduled lower (demoted by tenants.max_tier: the scheduler gates it, or
// gates nobody).
func TestTemporalLatencyCriticalWaitsOnlyBehindItsOwnTier(t *testing.T) {
	be := newEnv(t, true).withTenant(0, "")
	lc := be.another(0)
	lc2 := be.another(0)
	be2 := be.another(0)
	for _, e := range []*env{lc, lc2} {
		atomic.StoreUint32(&e.tbl.Container(e.reg.Slot).Tier, uint32(table.TierLatencyCritical))
	}
	be.playScheduler()
	for _, e := range []*env{be, lc, lc2, be2} {
		e.grant(table.ModeTemporal, 0)
	}
	gate := func(e *env, depth uint32) {
		if err := e.tbl.SetGate(e.reg.Slot, depth, 250); err != nil {
			t.Fatal(err)
		}
	}
	gate(be, 1) // what policy.TemporalGates gives lower tiers beside a latency-critical tenant
	gate(be2, 1)
	be.giveToken(be)
	lc.launchesAtOnce("the LC, the token held by a best-effort tenant")
	// A best-effort tenant without the token still waits ...
	if d := be2.heldLaunch(func() { time.Sleep(200 * time.Millisecond); be.giveToken(be2) }); d < 150*time.Millisecond {
		t.Errorf("best-effort tenant waited %v for the token, want >= 150ms", d)
	}
	// ... and so does the LC behind another latency-critical holder, until the token comes to it ...
	be.giveToken(lc2)
	if d := lc.heldLaunch(func() { time.Sleep(200 * time.Millisecond); be.giveToken(lc) }); d < 150*time.Millisecond {
		t.Errorf("LC waited %v behind another latency-critical holder, want >= 150ms", d)
	}
	// ... and a claimed latency-critical tenant the scheduler gates (demoted), or that finds nobody gated.
	demoted := lc2
	for _, c := range []struct {
		name        string
		self, other uint32
	}{{"gated itself", 1, 1}, {"holder not gated", 0, 0}} {
		gate(demoted, c.self)
		gate(be, c.other)
		be.giveToken(be)
		before := atomic.LoadUint64(&demoted.client.Page().QueueDelayNs)
		d := demoted.heldLaunch(func() { time.Sleep(200 * time.Millisecond); be.giveToken(demoted) })
		if d-time.Duration(before) < 150*time.Millisecond {
			t.Errorf("demoted latency-critical claimant (%s) waited %v for the token, want >= 150ms", c.name, d-time.Duration(before))
		}
	}
}

// A tenant paused by the scheduler (a spatial grant without groups: floor 0 beside a busy latency-critical tenant)
// has work while its launches wait: it must stay busy past its idle window, or the scheduler would count a paused
// trainer as idle, and its launch must go out once groups come back.
func TestPausedTenantStaysBusyWhileWaitingForSMs(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0)
	d := e.heldLaunch(func() {
		time.Sleep(200 * time.Millisecond)
		if d := atomic.LoadUint32(&e.client.Page().Demand); d != 1 {
			t.Errorf("demand %d while paused with work, want 1 (busy)", d)
		}
		e.grant(table.ModeSpatial, 0b11)
	})
	if d < 150*time.Millisecond {
		t.Errorf("queue delay %v, want >= 150ms: the launch did not wait for SMs", d)
	}
}

// Demand: the tenant is marked busy (and the doorbell rung) at its first launch, and idle again once it stops
// launching and its work drained; launches in between do not touch the doorbell.
func TestDemandBusyIdleTransitions(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b1111)
	bell := &e.tbl.Doorbell().Seq
	before := atomic.LoadUint32(bell)
	e.vars = append(e.vars, "DETSHARE_IDLE_MS=150")
	p := e.start("ds_probe_rt", "init", "stream", "axpy:20", "pause", "axpy:5")
	p.until()
	pg := e.client.Page()
	if d := atomic.LoadUint32(&pg.Demand); d != 1 {
		t.Fatalf("demand after launching = %d, want 1", d)
	}
	if rung := atomic.LoadUint32(bell) - before; rung != 1 {
		t.Fatalf("doorbell rung %d times for 20 launches, want once (idle->busy only)", rung)
	}
	deadline := time.Now().Add(5 * time.Second)
	for atomic.LoadUint32(&pg.Demand) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("tenant still busy 5s after its last launch")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rung := atomic.LoadUint32(bell) - before; rung != 2 {
		t.Errorf("doorbell rung %d times after going idle, want 2", rung)
	}
	if atomic.LoadUint64(&pg.BusyNs) == 0 {
		t.Errorf("busy_ns not accounted")
	}
	p.resume()
	p.finish()
	if atomic.LoadUint32(&pg.Demand) != 0 {
		t.Errorf("demand %d after the process exited", atomic.LoadUint32(&pg.Demand))
	}
}

// Conformance: CUDA's stream semantics (query, synchronize, legacy and per-thread default streams, blocking vs
// non-blocking, events, cross-stream waits, context synchronize) are the same with kernels moved to green-context
// streams as without the library.
func TestStreamSemanticsConformance(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			bare := newEnv(t, false).run(prog, "init", "conform")
			e := newEnv(t, true).withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, 0b110)
			with := e.run(prog, "init", "conform", "smid:64")
			if g := groupsOf(t, with, "smid"); !within(g, 0b110) {
				t.Fatalf("kernels were not confined to the grant during the checks: groups %v", g)
			}
			checks := 0
			for _, l := range bare.order {
				if !strings.HasPrefix(l.step, "conform:") {
					continue
				}
				checks++
				if l.kv["ok"] != "1" {
					t.Errorf("simulated GPU without the library fails %s: %v", l.step, l.kv)
				}
				if w := with.steps[l.step]; w == nil || w["ok"] != "1" || w["rc"] != "0" {
					t.Errorf("%s: without the library %v, with it %v", l.step, l.kv, w)
				}
			}
			if checks < 10 {
				t.Fatalf("only %d conformance checks ran:\n%s", checks, strings.Join(bare.lines, "\n"))
			}
			if n := atomic.LoadUint64(&e.client.Page().Launches); n < 8 {
				t.Fatalf("the library saw %d launches: the checks did not go through it", n)
			}
		})
	}
}

const fullGrant = 0x7fff

// graphFollowsGrants captures a graph under grants[0] (kernels from a module, or from a library as cudart loads
// them), launches it once under each grant in turn and checks where it ran: on all 132 SMs under the full grant,
// within the granted groups otherwise.
func graphFollowsGrants(t *testing.T, kernels string, grants ...uint64) {
	t.Helper()
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, grants[0])
	steps := []string{"init", "stream"}
	if kernels == "libkernels" {
		steps = append(steps, "libkernels")
	}
	steps = append(steps, "capture:132", "graph")
	for range grants[1:] {
		steps = append(steps, "pause", "graph")
	}
	p := e.start("ds_probe_rt", steps...)
	for i, g := range grants {
		r := p.under(e, g, i, len(grants))
		if g == fullGrant {
			if n := r.num(t, "graph", "distinct"); n != 132 {
				t.Fatalf("launch %d, under the full grant: the graph used %d SMs, want all 132", i, n)
			}
		} else if got := groupsOf(t, r, "graph"); !within(got, g) || len(got) != bits.OnesCount64(g) {
			t.Fatalf("launch %d, under groups %#x: the graph ran on groups %v", i, g, got)
		}
	}
}

// A graph captured while the tenant holds every group is captured as the application asked (primary context, every
// SM: a solo tenant pays nothing), moved to the grant's SMs when the grant shrinks, and back to every SM when it
// grows again. Kernels from a library (cudart's way: the node knows its CUkernel) are moved by re-contexting the
// nodes; module functions (no CUkernel) by the replay fallback, which can move them to a green context only.
func TestCaptureUnderFullGrantFollowsTheGrant(t *testing.T) {
	for _, kernels := range []string{"module", "libkernels"} {
		t.Run(kernels, func(t *testing.T) { graphFollowsGrants(t, kernels, fullGrant, 0b1100, fullGrant) })
	}
}

// A graph captured under a partial grant is re-contexted to every SM when the tenant gets the whole GPU (kernels
// from a library), and to another green context when the grant moves.
func TestGraphCapturedOnPartialGrantGrowsWithTheGrant(t *testing.T) {
	graphFollowsGrants(t, "libkernels", 0b11, fullGrant, 0b1100)
}

// When the application changes a graph executable (here: cuGraphExecKernelNodeSetParams_v2), the copy the library
// made of it for another grant must never be launched in its place, since it would run the old parameters: from then
// on the executable runs as the application left it, on the SMs it was captured on.
func TestChangedGraphExecutableRunsAsChanged(t *testing.T) {
	for _, prog := range probes {
		t.Run(prog, func(t *testing.T) {
			e := newEnv(t, true).withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, 0b11)
			p := e.start(prog, "init", "stream", "libkernels", "capturekeep:64", "graph", "pause", "graph",
				"graphset", "graph")
			if g := groupsOf(t, p.until(), "graph"); !within(g, 0b11) {
				t.Fatalf("captured on {0,1}: graph ran on groups %v", g)
			}
			r := p.under(e, 0b1100, 1, 2)
			if rc := r.get(t, "graphset", "rc"); rc != "0" {
				t.Fatalf("cuGraphExecKernelNodeSetParams_v2 failed: rc %s", rc)
			}
			runs := groupsOfEach(t, r, "graph")
			if len(runs) != 2 {
				t.Fatalf("want two graph launches after the grant moved, got %d:\n%s", len(runs), strings.Join(r.lines, "\n"))
			}
			if !within(runs[0], 0b1100) {
				t.Fatalf("before the change: the graph ran on groups %v, want within {2,3} (the copy for the grant)", runs[0])
			}
			if !within(runs[1], 0b11) {
				t.Fatalf("after the application changed its executable the graph ran on groups %v: the library's copy "+
					"for {2,3} was launched instead of the changed executable (captured on {0,1})", runs[1])
			}
		})
	}
}

// A captured graph with a memset node (frameworks zero buffers inside their graphs) is re-made for a new grant too:
// it follows the grant and its memset still runs in the copy.
func TestCapturedGraphWithMemsetFollowsTheGrant(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	p := e.start("ds_probe_rt", "init", "stream", "capturememset:64", "graph", "pause", "graph")
	r := p.until()
	if g := groupsOf(t, r, "graph"); !within(g, 0b11) {
		t.Fatalf("captured: graph ran on groups %v, granted {0,1}", g)
	}
	e.grant(table.ModeSpatial, 0b1100)
	p.resume()
	r = p.finish()
	if g := groupsOf(t, r, "graph"); !within(g, 0b1100) || len(g) != 2 {
		t.Fatalf("after the grant moved to {2,3} the graph with a memset node ran on groups %v", g)
	}
	seen := 0
	for _, l := range r.lines {
		if strings.HasPrefix(l, "graph_memset ") {
			seen++
			if !strings.Contains(l, "set=16") {
				t.Fatalf("the memset node did not run in a replay: %s", l)
			}
		}
	}
	if seen == 0 {
		t.Fatalf("no graph_memset line after the grant moved:\n%s", strings.Join(r.lines, "\n"))
	}
	if strings.Contains(strings.Join(r.lines, "\n"), "cannot be re-made") {
		t.Fatalf("the library gave up re-making the graph:\n%s", strings.Join(r.lines, "\n"))
	}
}

// A tenant the live scheduler has not answered yet holds its first launches until its first grant arrives, so it
// never runs on the whole GPU beside its neighbours; without a live scheduler it is not held (fail-open).
func TestFirstLaunchWaitsForTheFirstGrant(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler() // heartbeat alive, split published, no grant yet
	done := make(chan result, 1)
	go func() { done <- e.run("ds_probe_rt", "init", "stream", "smid:132") }()
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("the probe finished before any grant was published:\n%s", strings.Join(r.lines, "\n"))
	default:
	}
	e.grant(table.ModeSpatial, 0b11)
	r := <-done
	if g := groupsOf(t, r, "smid"); !within(g, 0b11) {
		t.Fatalf("first kernels ran on groups %v, want only the first grant {0,1}", g)
	}
}

// A grant that grows to groups whose green context the process has not made yet: the context is made off the launch
// path (the test double, like the H100, makes that driver call wait for the process's in-flight work), launches keep
// running inside the grant on the context they had, and the new one is used once it is ready. The launch right
// after the change must not wait for the 1-second kernel in flight.
func TestGrownGrantContextMadeOffTheLaunchPath(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	e.vars = append(e.vars, "DETSHARE_LOG=info")
	// the sleep: the helper thread and the probe both wake when the long kernel ends; give the helper its moment
	p := e.start("ds_probe_rt", "init", "stream", "smid:16", "spinlaunch:1000", "pause", "spinlaunch:1", "smid:64",
		"sleep:200", "smid:64")
	if g := groupsOf(t, p.until(), "smid"); !within(g, 0b11) {
		t.Fatalf("before the change: groups %v, granted {0,1}", g)
	}
	r := p.under(e, 0b1111, 1, 2)
	ms, err := strconv.ParseFloat(r.get(t, "spinlaunch", "call_ms"), 64)
	if err != nil || ms > 500 {
		t.Fatalf("the first launch after the grant grew took %v ms (%v): it waited for the kernel in flight", ms, err)
	}
	runs := groupsOfEach(t, r, "smid")
	if len(runs) != 2 {
		t.Fatalf("want two smid runs after the change:\n%s", strings.Join(r.lines, "\n"))
	}
	for i, g := range runs {
		if !within(g, 0b1111) {
			t.Fatalf("run %d after the grant grew to {0..3}: groups %v", i, g)
		}
	}
	if g := runs[1]; !g[2] && !g[3] {
		t.Fatalf("once the context was made, kernels still ran on %v only, not on the grown grant {0..3}", g)
	}
	if !strings.Contains(strings.Join(p.lines, "\n"), "made off the launch path") {
		t.Fatalf("the library did not report making the context off the launch path:\n%s", strings.Join(p.lines, "\n"))
	}
}

// Kernels redirected to a physical stream are tied to the application's stream by event edges only where order can
// be observed (an edge in before the first kernel, a join before the synchronisation), not around every kernel:
// 200 dependent kernels on one stream cost a handful of event records. DETSHARE_STRICT_STREAMS=1 (an edge pair around
// every kernel) costs at least two per kernel. The result is the same either way, and the kernels stay confined.
func TestRedirectedKernelsTakeEdgesOnlyWhereOrderIsObserved(t *testing.T) {
	const k = 200
	run := func(strict bool) result {
		e := newEnv(t, true).withTenant(0, "")
		e.playScheduler()
		e.grant(table.ModeSpatial, 0b110)
		e.vars = append(e.vars, "DETSHARE_SIMGPU_CALLS=1")
		if strict {
			e.vars = append(e.vars, "DETSHARE_STRICT_STREAMS=1")
		}
		r := e.run("ds_probe_rt", "init", "stream", "axpy:"+strconv.Itoa(k), "smid:64")
		if g := groupsOf(t, r, "smid"); !within(g, 0b110) {
			t.Fatalf("kernels not confined to {1,2}: groups %v", g)
		}
		return r
	}
	lazy, strict := run(false), run(true)
	bare := newEnv(t, false).run("ds_probe_rt", "init", "stream", "axpy:"+strconv.Itoa(k))
	for name, r := range map[string]result{"lazy": lazy, "strict": strict} {
		if h := r.get(t, "axpy", "hash"); h != bare.get(t, "axpy", "hash") {
			t.Fatalf("%s edges: axpy hash %s, without the library %s", name, h, bare.get(t, "axpy", "hash"))
		}
	}
	t.Logf("event records for %d kernels: lazy %d, strict %d", k, lazy.num(t, "simgpu-calls", "event_record"),
		strict.num(t, "simgpu-calls", "event_record"))
	if n := lazy.num(t, "simgpu-calls", "event_record"); n > 10 {
		t.Fatalf("lazy edges: %d event records for %d kernels on one stream, want a handful", n, k)
	}
	if n := strict.num(t, "simgpu-calls", "event_record"); n < 2*k {
		t.Fatalf("strict edges: %d event records for %d kernels, want at least %d (the test cannot tell the modes "+
			"apart otherwise)", n, k, 2*k)
	}
}

// A graph's memset node runs on SMs too: when the graph moves to a new grant, the node moves with its kernels, and
// it still sets what it set. Library kernels (cuLibraryLoadData, as cudart loads them) move by re-contexting, the
// memset node with cuGraphNodeSetParams; module functions (Triton's way) move by replay, the memset replayed too.
func TestGraphMemsetNodeMovesWithTheGrant(t *testing.T) {
	for _, kernels := range []string{"libkernels", "modulekernels"} {
		t.Run(kernels, func(t *testing.T) {
			e := newEnv(t, true).withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, 0b11)
			e.vars = append(e.vars, "DETSHARE_SIMGPU_CALLS=1", "DETSHARE_LOG=debug")
			steps := []string{"init", "stream", "capturememset:64", "pause", "graph"}
			if kernels == "libkernels" {
				steps = []string{"init", "stream", "libkernels", "capturememset:64", "pause", "graph"}
			}
			// captured under {0,1}, launched only after the grant moved to {2,3}: every device-side operation of
			// the run happens under {2,3}, so one on {0,1} can only be the graph's memset node left behind
			p := e.start("ds_probe_rt", steps...)
			p.until()
			e.grant(table.ModeSpatial, 0b1100)
			p.resume()
			r := p.finish()
			if g := groupsOf(t, r, "graph"); !within(g, 0b1100) || len(g) != 2 {
				t.Fatalf("after the grant moved to {2,3} the graph's kernel ran on groups %v", g)
			}
			if l := r.get(t, "graph_memset", "set"); l != "16" {
				t.Fatalf("the moved graph's memset node set %s words, want 16", l)
			}
			g := smGroupsOfRanges(t, r.get(t, "simgpu-calls", "device_op_sms"))
			if !within(g, 0b1100) || len(g) == 0 {
				t.Fatalf("device-side operations ran on groups %v: the graph's memset node stayed on its capture "+
					"grant {0,1}", g)
			}
			how := map[string]string{"libkernels": "re-contexted", "modulekernels": "replayed"}[kernels]
			if !strings.Contains(strings.Join(r.lines, "\n"), how+" for context") {
				t.Fatalf("the graph was not %s:\n%s", how, strings.Join(r.lines, "\n"))
			}
		})
	}
}

// smGroupsOfRanges turns the test double's "first-last,first-last" SM ranges into the 8-SM groups they touch.
func smGroupsOfRanges(t testing.TB, ranges string) map[int]bool {
	t.Helper()
	g := map[int]bool{}
	if ranges == "-" {
		return g
	}
	for _, rg := range strings.Split(ranges, ",") {
		var lo, hi int
		if _, err := fmt.Sscanf(rg, "%d-%d", &lo, &hi); err != nil || lo > hi {
			t.Fatalf("bad SM range %q in %q", rg, ranges)
		}
		for sm := lo; sm <= hi; sm++ {
			g[sm/8] = true
		}
	}
	return g
}

// Device-to-device copies and memsets run on SMs (on the H100 a copy issued on a primary-context stream took SMs
// from a neighbour's green context; integration/gpu/probes/copyescape.cu). The library sends them where the stream's
// kernels go, so they stay inside the grant, in order with the kernels around them, on the legacy stream as on a
// stream of the application's. Under a full grant they stay on the application's stream.
func TestDeviceCopiesAndMemsetsRunInsideTheGrant(t *testing.T) {
	const rounds = 40
	for _, stream := range []string{"legacy", "stream"} {
		steps := []string{"init", "dcopy:" + strconv.Itoa(rounds)}
		if stream == "stream" {
			steps = []string{"init", "stream", "dcopy:" + strconv.Itoa(rounds)}
		}
		bare := newEnv(t, false)
		bare.vars = append(bare.vars, "DETSHARE_SIMGPU_CALLS=1")
		rb := bare.run("ds_probe_rt", steps...)
		if g := smGroupsOfRanges(t, rb.get(t, "simgpu-calls", "device_op_sms")); len(g) < 16 {
			t.Fatalf("%s: without the library device copies ran on groups %v, want every SM (the test double does "+
				"not model where copies run)", stream, g)
		}
		for _, c := range []struct {
			name string
			mask uint64
		}{{"groups {1,2}", 0b110}, {"every group", 1<<16 - 1}} {
			e := newEnv(t, true).withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, c.mask)
			e.vars = append(e.vars, "DETSHARE_SIMGPU_CALLS=1")
			r := e.run("ds_probe_rt", steps...)
			if h, want := r.get(t, "dcopy", "hash"), rb.get(t, "dcopy", "hash"); h != want {
				t.Fatalf("%s, %s: dcopy hash %s, without the library %s", stream, c.name, h, want)
			}
			if n := r.num(t, "simgpu-calls", "device_ops"); n < 2*rounds {
				t.Fatalf("%s, %s: %d device copies and memsets, want at least %d", stream, c.name, n, 2*rounds)
			}
			g := smGroupsOfRanges(t, r.get(t, "simgpu-calls", "device_op_sms"))
			if c.mask == 0b110 && (!within(g, c.mask) || len(g) != 2) {
				t.Fatalf("%s, %s: device copies and memsets ran on groups %v, want exactly the grant", stream, c.name, g)
			}
			if c.mask != 0b110 && len(g) < 16 { // the application's stream: every SM, the remainder included
				t.Fatalf("%s, %s: device copies and memsets ran on groups %v, want every SM", stream, c.name, g)
			}
		}
	}
}

// Green contexts the application makes itself are kept within the tenant's grant.
func TestAppGreenContextKeptWithinGrant(t *testing.T) {
	bare := newEnv(t, false).run("ds_probe_rt", "init", "appgreen:9", "smid:64")
	if g := groupsOf(t, bare, "smid"); len(g) != 1 || !g[9] {
		t.Fatalf("without the library the application's green context ran on groups %v, want {9}", g)
	}
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	r := e.run("ds_probe_rt", "init", "appgreen:9", "smid:64")
	if g := groupsOf(t, r, "smid"); !within(g, 0b11) {
		t.Fatalf("the application's own green context (group 9) escaped the grant {0,1}: ran on %v", g)
	}
}

// A host tenant (`detshare run`) publishes the split it learnt when the table has none; a container tenant, whose
// table is read-only, leaves it to the scheduler.
func TestHostTenantPublishesSplit(t *testing.T) {
	e := newEnv(t, true)
	tbl, err := table.Create(e.runDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tbl.Close() })
	if err := tbl.SetGPUs([]table.GPUInfo{{Index: 0, UUID: "SIM-0", Name: "DetShare simulated GPU (test double)",
		SMCount: 132, MemTotal: simMem}}); err != nil {
		t.Fatal(err)
	}
	// a container tenant first: nothing published
	c := (&env{t: t, vars: append([]string(nil), e.vars...), runDir: e.runDir}).withTenant(0, "")
	c.grant(table.ModeSpatial, 0b1)
	c.run("ds_probe_rt", "init", "smid:8")
	if st := tbl.GPUs()[0].Split; st.Published {
		t.Fatalf("a container tenant published the split %+v", st)
	}
	reg, err := tbl.Register(table.RegisterRequest{ID: "host-tenant", Tier: table.TierBestEffort, Weight: 1, GPU: 0,
		OwnerPID: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if !reg.HostTenant() {
		t.Fatal("registration with an owner PID is not a host tenant")
	}
	h := &env{t: t, vars: append([]string(nil), e.vars...), runDir: e.runDir}
	h.tbl, h.reg = tbl, reg
	qf := filepath.Join(t.TempDir(), "quota")
	if err := os.WriteFile(qf, quota.Render(quota.File{Version: quota.QuotaFileVersion, ID: reg.ID, Slot: reg.Slot,
		SlotGen: reg.Gen, FilePaths: quota.FilePaths{Table: tbl.Paths().Table(), ClientPage: reg.ClientPagePath,
			Doorbell: tbl.Paths().Doorbell()}}), 0o644); err != nil {
		t.Fatal(err)
	}
	h.vars = append(h.vars, "DETSHARE_QUOTA_FILE="+qf)
	h.grant(table.ModeSpatial, 0b1)
	r := h.run("ds_probe_rt", "init", "smid:64")
	if g := groupsOf(t, r, "smid"); !within(g, 0b1) {
		t.Fatalf("host tenant ran on groups %v, granted {0}", g)
	}
	s := tbl.GPUs()[0].Split
	if !s.Published || len(s.Groups) != 15 || s.Groups[0] != 8 || s.Remainder != 12 || s.MinSize != 8 {
		t.Fatalf("split published by the host tenant: %+v, want 15 groups of 8 + 12 left over", s)
	}
}

// Many threads on their own streams and per-thread default streams, while the grant changes every 2 ms: results
// are bit-identical to a run without the library and no kernel leaves the groups granted at some point.
func TestThreadsUnderChangingGrants(t *testing.T) {
	bare := newEnv(t, false).run("ds_probe_rt", "init", "mt:8x1500")
	want := bare.get(t, "mthash", "hash")
	if bare.get(t, "mthash", "same") != "1" {
		t.Fatalf("threads disagree without the library: %v", bare.lines)
	}
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	// The flipper publishes from its own goroutine, so it reports errors instead of failing the test there
	// (t.Fatalf must run on the test's goroutine), and it is stopped on every way out of the test: were e.run to
	// fail, a flipper left running would publish into a closed table after the test ended.
	stop := make(chan struct{})
	type flips struct {
		n   int
		err error
	}
	flipped := make(chan flips, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				flipped <- flips{n: n}
				return
			case <-time.After(2 * time.Millisecond):
				g := table.Grant{Groups: 0b1100, SMs: 16, Mode: table.ModeSpatial}
				if n%2 != 0 {
					g.Groups = 0b11
				}
				if err := e.tbl.PublishGrant(e.reg.Slot, g); err != nil {
					flipped <- flips{n: n, err: err}
					return
				}
				n++
			}
		}
	}()
	stopped := false
	stopFlipper := func() flips {
		if stopped {
			return flips{}
		}
		stopped = true
		close(stop)
		return <-flipped
	}
	t.Cleanup(func() { stopFlipper() })
	r := e.run("ds_probe_rt", "init", "mt:8x1500")
	f := stopFlipper()
	if f.err != nil {
		t.Fatalf("publish grant: %v", f.err)
	}
	n := f.n
	if r.get(t, "mthash", "same") != "1" || r.get(t, "mthash", "hash") != want {
		t.Errorf("results under changing grants: %v, want every thread %s", r.steps["mthash"], want)
	}
	if g := groupsOf(t, r, "mt"); !within(g, 0b1111) {
		t.Errorf("kernels ran on groups %v, never granted anything outside {0,1,2,3}", g)
	}
	if n < 3 {
		t.Fatalf("only %d grant changes happened during the run: it proves nothing", n)
	}
	t.Logf("%d grant changes during the run", n)
}

// A graph captured under one grant and launched under another runs on the SMs of the grant it is launched under
// (a copy made once per grant and cached), even after the application destroyed the source graph.
func TestCapturedGraphFollowsTheGrant(t *testing.T) {
	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	e.grant(table.ModeSpatial, 0b11)
	p := e.start("ds_probe_rt", "init", "stream", "capture:64", "graph", "pause", "graph", "pause", "graph", "pause",
		"graph")
	steps := []struct {
		grant uint64
		name  string
	}{{0b11, "captured"}, {0b1100, "shrunk"}, {0b11, "back"}, {0b110000, "moved"}}
	for i, s := range steps {
		r := p.under(e, s.grant, i, len(steps))
		g := groupsOf(t, r, "graph")
		if !within(g, s.grant) || len(g) != 2 {
			t.Errorf("%s: graph ran on groups %v, granted %b", s.name, g, s.grant)
		}
	}
}

// A context-wide synchronisation waits for kernels the library sent to a green context's physical stream. On the
// H100 under MPS a primary-context cuCtxSynchronize did not (torch.cuda.synchronize() returned before a CUDA-graph
// replay ran, BENCHMARKS.md "the early context synchronisation"), though the library had tied the physical stream
// into the application's with an event; the simulated GPU models that driver behaviour with
// DETSHARE_SIMGPU_CTX_SYNC=own-context (a context's synchronisation waits for its own streams, and not for a wait
// on another context's event that ends one). Natively the model changes nothing: the kernel is the context's own.
func TestContextSyncWaitsForPhysicalStreams(t *testing.T) {
	const kernelMs = 300
	steps := []string{"init", "spinlaunch:" + strconv.Itoa(kernelMs), "ctxsync", "smid:16"}
	for _, confined := range []bool{false, true} {
		e := newEnv(t, confined)
		if confined {
			e = e.withTenant(0, "")
			e.playScheduler()
			e.grant(table.ModeSpatial, 0b11)
		}
		e.vars = append(e.vars, "DETSHARE_SIMGPU_CTX_SYNC=own-context")
		r := e.run("ds_probe_rt", steps...)
		if confined {
			if g := groupsOf(t, r, "smid"); !within(g, 0b11) {
				t.Fatalf("kernels ran on groups %v, granted {0,1}: this test needs them on a physical stream", g)
			}
		}
		ms, err := strconv.ParseFloat(r.get(t, "ctxsync", "waited_ms"), 64)
		if err != nil || r.get(t, "ctxsync", "rc") != "0" {
			t.Fatalf("confined=%v: ctxsync: %v\n%s", confined, err, strings.Join(r.lines, "\n"))
		}
		if ms < kernelMs*8/10 {
			t.Errorf("confined=%v: cuCtxSynchronize returned after %.1f ms, before the %d ms kernel ended", confined,
				ms, kernelMs)
		}
	}
}
