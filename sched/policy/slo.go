package policy

import (
	"time"

	"github.com/detshare/detshare/internal/table"
)

// LatencyBuckets is the number of buckets of the latency histogram libdetshare keeps in a client page: bucket i
// counts completions that took [2^i, 2^(i+1)) microseconds (bucket 0 also holds everything below 1 µs, the last
// everything above).
const LatencyBuckets = 32

// MinLatencySamples is how many completions a window needs before its P99 is used for sizing.
const MinLatencySamples = 20

// P99Samples is how many completions a window gathers before the controller trusts a P99 inside the SLO: with
// fewer the 99th percentile is the window's largest sample (27 completions of a 2.4 ms service in 250 ms), which
// overstates the run's P99 and sent the controller to its most protective share on an H100 where the run met the SLO
// with more left to the neighbours (BENCHMARKS.md, issue 26). A miss needs no such wait: MissEvidence completions
// certainly above the SLO end the window early, since no window of P99Samples could then have its P99 inside it.
const (
	P99Samples   = 100
	MissEvidence = 2
)

// HistP99 returns the 99th percentile of a latency histogram (the upper edge of the bucket it falls in, so never
// optimistic) and the number of samples. 0 with no samples.
func HistP99(h [LatencyBuckets]uint64) (time.Duration, uint64) {
	n := histTotal(h)
	if n == 0 {
		return 0, 0
	}
	// rank of the 99th percentile, 1-based (written so that no product can overflow on forged counters)
	rank := n - n/100
	var s uint64
	for i, c := range h {
		s = satAdd(s, c)
		if s >= rank {
			return time.Duration(uint64(1)<<(i+1)) * time.Microsecond, n
		}
	}
	return time.Duration(uint64(1)<<LatencyBuckets) * time.Microsecond, n
}

// satAdd adds without wrapping: counters come from tenant-written pages.
func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

func histTotal(h [LatencyBuckets]uint64) uint64 {
	var n uint64
	for _, c := range h {
		n = satAdd(n, c)
	}
	return n
}

// HistDelta is the histogram of the completions between two cumulative snapshots. Counters that went backwards
// (a page reset or a forged page) count as zero: the result can only under-report, never widen a grant.
func HistDelta(cur, prev [LatencyBuckets]uint64) [LatencyBuckets]uint64 {
	var d [LatencyBuckets]uint64
	deltaInto(d[:], cur[:], prev[:])
	return d
}

// deltaInto writes cur - prev per bucket into d, a counter that went backwards as zero.
func deltaInto(d, cur, prev []uint64) {
	for i := range d {
		if cur[i] > prev[i] {
			// no process completes 2^40 requests in a window: a larger step is forged, and capping it keeps the
			// window's sums exact
			d[i] = min(cur[i]-prev[i], 1<<40)
		}
	}
}

// WindowReady says whether an SLO window of n completions, above of them certainly over the SLO (WindowAbove), is
// ready for SLOControl.Step: it holds P99Samples, or enough completions with MissEvidence of them over the SLO, or
// it reached the longest window (full), where fewer than MinLatencySamples count as an idle tenant.
func WindowReady(n, above uint64, full bool) bool {
	return full || n >= P99Samples || (n >= MinLatencySamples && above >= MissEvidence)
}

// WindowAbove counts the completions of a window that certainly took longer than slo: those in buckets whose lower
// edge is at or above it (from the fine histogram where it counted every completion the octave one did, as
// WindowP99), so that a miss is never claimed from a bucket that straddles the target.
func WindowAbove(coarse [LatencyBuckets]uint64, fine [FineBuckets]uint64, slo time.Duration) uint64 {
	var n, fn, above, fabove uint64
	for i, c := range coarse {
		n = satAdd(n, c)
		if i > 0 && time.Duration(uint64(1)<<i)*time.Microsecond >= slo {
			above = satAdd(above, c)
		}
	}
	for b, c := range fine {
		fn = satAdd(fn, c)
		if b > 0 && fineUpper(b-1) >= slo {
			fabove = satAdd(fabove, c)
		}
	}
	if fn == n && n > 0 {
		return fabove
	}
	return above
}

// FineBuckets is the number of buckets of the fine latency histogram (table.LatFineBuckets): LatFineSub per octave
// from 2^LatFineMinOct microseconds, so that a P99 is known to within 1/8 of an octave (~9%) instead of 2x.
const FineBuckets = table.LatFineBuckets

// fineUpper is the upper edge of fine bucket b.
func fineUpper(b int) time.Duration {
	oct := table.LatFineMinOct + b/table.LatFineSub
	step := uint64(1) << (oct - 3) // table.LatFineSub = 8 buckets per octave
	return time.Duration(uint64(1)<<oct+uint64(b%table.LatFineSub+1)*step) * time.Microsecond
}

// FineP99 is the 99th percentile of a fine histogram (the upper edge of its bucket: never optimistic) and the
// number of samples; ok is false when there are none or the percentile lies in the last bucket, which also holds
// everything longer (then the octave histogram, HistP99, answers).
func FineP99(h [FineBuckets]uint64) (p99 time.Duration, n uint64, ok bool) {
	for _, c := range h {
		n = satAdd(n, c)
	}
	if n == 0 {
		return 0, 0, false
	}
	rank := n - n/100
	var s uint64
	for i, c := range h {
		s = satAdd(s, c)
		if s >= rank {
			return fineUpper(i), n, i < FineBuckets-1
		}
	}
	return 0, n, false
}

// FineDelta is HistDelta for the fine histogram.
func FineDelta(cur, prev [FineBuckets]uint64) [FineBuckets]uint64 {
	var d [FineBuckets]uint64
	deltaInto(d[:], cur[:], prev[:])
	return d
}

// WindowP99 is the P99 of a window: from the fine histogram where it counted every completion the octave one did
// (a library that keeps it) and the percentile is inside its range, else from the octave histogram.
func WindowP99(coarse [LatencyBuckets]uint64, fine [FineBuckets]uint64) (time.Duration, uint64) {
	p, n := HistP99(coarse)
	if fp, fn, ok := FineP99(fine); ok && fn == n {
		return fp, n
	}
	return p, n
}

// The SLO controller's thresholds, as fractions of the SLO. A window's P99 is taken over at least P99Samples
// completions and from the upper edge of its fine histogram bucket (up to 1/8 of an octave over), so a window at
// the SLO still means a run a little inside it: above 1 the window missed and a quarter of what was given back
// returns (at least one group), half of it above Far; between Hold and 1 nothing moves; below Hold one more group
// goes to the neighbours, below Slack two. On an H100 these held the run at 0.94-1.0 of the SLO (BENCHMARKS.md,
// issue 26); a Hold of 0.9 leaves the window above the SLO twice as often in TestSLOControllerConvergesInTheModel.
const (
	sloHold  = 0.85
	sloSlack = 0.65
	sloFar   = 1.5
	// infeasibleAfter: windows missed in a row at the most protective share before the SLO is reported as not
	// attainable on this GPU beside these neighbours.
	infeasibleAfter = 3
	// sloNoWorse: once an SLO is not attainable, the controller returns to the largest share whose window in the
	// same run of misses was within this fraction of the floor: protection that bought the LC nothing more is given
	// back to its neighbours.
	sloNoWorse = 0.10
	// sloPositions: positions whose latency the controller remembers through a run of misses (a ladder is at most
	// twice the GPU's groups plus their count; beyond this a position is simply not a candidate to return to).
	sloPositions = 64
)

// SLOControl is the per-latency-critical-tenant state of the SLO controller: how many groups the tenant leaves to
// lower tiers beyond one neighbour's floor (Shrink: 0 is the most protective share, everything but that floor; the
// maximum leaves it exactly its guarantee), which the daemon applies as the size of its exclusive partition
// (Tenant.Sized, ReserveOf), and what the controller learnt. The observed latency comes from the tenant's own page, so the worst a forged value can do is make its
// own tenant give groups back or take them all, which any latency-critical tenant without an SLO does anyway.
type SLOControl struct {
	Shrink int
	// Miss: the last window was above the SLO (reported; with issue 12's expansion lower tiers also get the
	// tightest dispatch gate meanwhile).
	Miss bool
	// Infeasible: the SLO was missed infeasibleAfter windows in a row at the most protective share: what the
	// neighbours have in flight (kernels are never cut) and MPS cost more than the SLO allows. Floor is the P99
	// measured at that share (once not attainable, the lowest window of that run of misses), what the tenant can
	// count on beside these neighbours; the controller then holds the largest share no worse than it (Holding).
	Infeasible bool
	Floor      time.Duration
	// LastP99 is the P99 of the last window that had enough samples.
	LastP99 time.Duration
	// Holding: the SLO is not attainable and the controller holds the largest share no worse than the floor
	// (sloNoWorse) instead of the most protective one.
	Holding bool
	missed0 int // windows in a row missed at Shrink 0
	// missP99: the P99 of each position's last window in the current run of misses (0: none), so that an SLO found
	// unattainable returns to a share that cost the LC no more than the floor did.
	missP99 [sloPositions]time.Duration
}

// Step moves the controller by one window: multiplicative decrease of the share given back when the SLO is missed,
// additive increase while comfortably inside it, a dead band between (sloHold). maxShrink is what the tenant can
// give back. A whole window with too few completions gives one group: an idle latency-critical tenant has nothing
// to protect.
func (c *SLOControl) Step(slo, p99 time.Duration, samples uint64, maxShrink int) {
	if slo <= 0 || maxShrink <= 0 {
		*c = SLOControl{}
		return
	}
	if samples < MinLatencySamples {
		// a whole window with too few completions: nothing to protect, so the share moves one group towards
		// the neighbours (a latency-critical tenant that stays idle ends on its guarantee)
		c.Shrink = min(c.Shrink+1, maxShrink)
		c.Miss = false
		return
	}
	c.LastP99 = p99
	r := float64(p99) / float64(slo)
	c.Miss = r > 1
	if c.Shrink == 0 {
		c.Floor = p99 // the most protective share's latency, refreshed whenever the controller is there
	}
	if !c.Miss {
		c.missP99, c.Holding = [sloPositions]time.Duration{}, false
	} else if c.Shrink < sloPositions {
		c.missP99[c.Shrink] = p99
	}
	switch {
	case r > 1 && c.Holding && float64(p99) <= float64(c.Floor)*(1+sloNoWorse):
		// not attainable, and this share costs the LC no more than the most protective one: hold it
	case r > 1:
		if c.Holding {
			// worse than the floor: the neighbours changed; find the floor again from here
			c.Holding, c.missed0, c.missP99 = false, 0, [sloPositions]time.Duration{}
			if c.Shrink < sloPositions {
				c.missP99[c.Shrink] = p99
			}
		}
		if c.Shrink == 0 {
			c.missed0++
			c.Infeasible = c.missed0 >= infeasibleAfter
			if c.Infeasible {
				c.holdNoWorse(maxShrink)
				return
			}
		}
		if r > sloFar {
			c.Shrink /= 2 // far above: the neighbours' share was far too large, halve it at once
		} else {
			c.Shrink -= max(1, c.Shrink/4)
		}
	case r < sloSlack:
		c.missed0, c.Infeasible = 0, false
		c.Shrink += 2
	case r < sloHold:
		c.missed0, c.Infeasible = 0, false
		c.Shrink++
	default:
		c.missed0, c.Infeasible = 0, false
	}
	c.Shrink = min(max(c.Shrink, 0), maxShrink)
}

// holdNoWorse moves an SLO found unattainable to the largest share whose window in this run of misses was within
// sloNoWorse of the floor (the lowest window P99 of the run, normally one at the most protective share), and holds it there while its
// windows stay that close (Step). Beside an H100 trainer the LC's tail near the most protective share hardly depended
// on the trainer's share (BENCHMARKS.md, issue 26): going there cost the trainer half its throughput for nothing.
func (c *SLOControl) holdNoWorse(maxShrink int) {
	floor := c.missP99[0]
	for _, p := range c.missP99 {
		if p > 0 && p < floor {
			floor = p // a share above the most protective one that measured lower is as good a floor
		}
	}
	if floor <= 0 {
		return
	}
	c.Floor = floor
	for k := min(maxShrink, sloPositions-1); k > 0; k-- {
		if p := c.missP99[k]; p > 0 && float64(p) <= float64(floor)*(1+sloNoWorse) {
			c.Shrink, c.Holding = k, true
			return
		}
	}
}

// SLOLadder maps an SLO controller's position (SLOControl.Shrink, 0 = the most protective) to the two things it moves
// for the neighbours of a latency-critical tenant: groups of its partition given back (Tenant.Shrink) and groups added
// to the narrow part of their grants where their memory-bound kernels run (Tenant.NarrowWiden). Every step up gives
// the neighbours one more group of one of the two, never both:
//
//   - up to Start (the default partition): the partition shrinks from everything but the neighbours' floor, their
//     narrow part at Options.NarrowGroups;
//   - then Widen steps: the narrow part widens to the neighbours' whole default grant;
//   - then Grow steps: the partition shrinks to the tenant's guarantee, the narrow part staying at the default grant's
//     width, so the groups given back run GEMMs only;
//   - then Grow more steps (narrowing on): the narrow part widens to the whole grant (narrowing off, NarrowOff).
//
// Why this order, measured on an H100 (BENCHMARKS.md, issue 26): widening costs the LC least per unit of trainer
// throughput at the default partition; beyond it, a small partition with narrowing kept on gave the fp32 trainer the
// same share as narrowing off at a lower P99 (0.64–0.66 at ×2.41–2.57 of solo against 0.63–0.65 at ×3.25–3.60), and
// narrowing off last is the bf16 trainer's largest share (0.81 against 0.73) for the LC's highest tail.
type SLOLadder struct {
	Start, Widen, Grow int
	narrowing          bool
}

// NewSLOLadder is the ladder of a latency-critical tenant whose default partition gives back start groups of the
// maxShrink it can give back.
func NewSLOLadder(start, maxShrink int, o Options) SLOLadder {
	start = min(max(start, 0), max(maxShrink, 0))
	return SLOLadder{Start: start, Widen: NarrowSteps(start, o), Grow: max(maxShrink, 0) - start,
		narrowing: o.NarrowGroups > 0}
}

// Top is the highest position: the tenant on its guarantee, the neighbours' memory-bound kernels on their whole grants.
func (l SLOLadder) Top() int {
	if !l.narrowing {
		return l.Start + l.Grow
	}
	return l.Start + l.Widen + 2*l.Grow
}

// Levels is what position pos gives the neighbours: groups of the partition given back and the narrow part's widening.
func (l SLOLadder) Levels(pos int) (shrink, narrowWiden int) {
	pos = min(max(pos, 0), l.Top())
	switch {
	case pos <= l.Start:
		return pos, 0
	case !l.narrowing:
		return pos, NarrowOff
	case pos <= l.Start+l.Widen:
		return l.Start, pos - l.Start
	case pos <= l.Start+l.Widen+l.Grow:
		return pos - l.Widen, l.Widen
	case pos == l.Top():
		return l.Start + l.Grow, NarrowOff
	default:
		return l.Start + l.Grow, pos - l.Start - l.Grow
	}
}

// NarrowOff as a Tenant.NarrowWiden: the neighbours' memory-bound kernels run on their whole grants.
const NarrowOff = 64

// NarrowSteps is how many groups the SLO controller can add to the narrow part of a neighbour's grant before it
// covers the whole default grant: the neighbour of a tenant whose partition leaves it start groups beyond its floor
// holds floor + start groups. 0 when narrowing is off.
func NarrowSteps(start int, o Options) int {
	if o.NarrowGroups <= 0 {
		return 0
	}
	return max(0, max(o.Floor, 1)+start-o.NarrowGroups)
}

// HistWithin counts the completions of h that certainly took at most slo (whole buckets whose upper edge is within
// it: a bucket straddling the target counts as missed, so attainment is never overstated) and all completions.
func HistWithin(h [LatencyBuckets]uint64, slo time.Duration) (within, total uint64) {
	for i, c := range h {
		total = satAdd(total, c)
		if time.Duration(uint64(1)<<(i+1))*time.Microsecond <= slo {
			within = satAdd(within, c)
		}
	}
	return within, total
}
