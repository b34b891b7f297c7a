package libdetshare_test

import (
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// Beside a latency-critical tenant the scheduler sets a lower tier's narrow_groups (scheduler.narrow_groups, issue 26):
// its memory-bound kernels (less than 8 KiB of shared memory) run on the lowest groups of its grant, its other kernels
// on all of it, one stream interleaving both in order; with narrow_groups back at 0 everything runs on the whole grant
// again. Results stay bit-identical to a run without the library (the axpy hash).
func TestMemoryBoundKernelsRunOnTheNarrowGroups(t *testing.T) {
	steps := []string{"init", "stream", "smid:256", "smidsmem:256:32768", "smidsmem:256:4096", "axpy:50",
		"capture:256", "graph", "pause",
		"smid:256", "axpy:50"}
	ref := newEnv(t, false).start("ds_probe_rt", steps...)
	ref.until()
	ref.resume()
	want := ref.finish()

	e := newEnv(t, true).withTenant(0, "")
	e.playScheduler()
	if err := e.tbl.SetNarrow(e.reg.Slot, 2); err != nil {
		t.Fatalf("set narrow: %v", err)
	}
	const grant = uint64(0x7f00) // groups 8-14, as beside a latency-critical tenant holding 0-7
	e.grant(table.ModeSpatial, grant)
	p := e.start("ds_probe_rt", steps...)
	before := p.until()
	if g := groupsOf(t, before, "smid"); !within(g, 1<<8|1<<9) || !g[8] || !g[9] {
		t.Errorf("a kernel without shared memory ran on groups %v, want 8 and 9 (the grant's lowest two)", g)
	}
	each := groupsOfEach(t, before, "smidsmem")
	if len(each) != 2 {
		t.Fatalf("want two smidsmem lines, got %d", len(each))
	}
	if g := each[0]; !within(g, grant|remainderBlocks) || !g[14] || !g[8] {
		t.Errorf("a kernel with 32 KiB of shared memory ran on groups %v, want the whole grant 8-14", g)
	}
	if g := each[1]; !within(g, 1<<8|1<<9) {
		t.Errorf("a kernel with 4 KiB of shared memory ran on groups %v, want 8 and 9", g)
	}
	// a graph is launched as a whole on the whole grant; its memory-bound kernels were not narrowed while captured
	if g := groupsOf(t, before, "graph"); !within(g, grant|remainderBlocks) || !g[14] {
		t.Errorf("a captured graph of a kernel without shared memory ran on groups %v, want the whole grant 8-14", g)
	}
	if err := e.tbl.SetNarrow(e.reg.Slot, 0); err != nil {
		t.Fatalf("set narrow: %v", err)
	}
	p.resume()
	after := p.finish()
	if g := groupsOf(t, after, "smid"); !within(g, grant|remainderBlocks) || !g[14] {
		t.Errorf("with narrow_groups 0 a kernel without shared memory ran on groups %v, want the whole grant 8-14", g)
	}
	for _, r := range []result{before, after} {
		if got, w := r.get(t, "axpy", "hash"), want.get(t, "axpy", "hash"); got != w {
			t.Errorf("axpy hash %s with the library, %s without: the interleaved kernels changed the results", got, w)
		}
	}
}
