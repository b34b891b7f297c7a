package policy

import "time"

// LatencyBuckets is the number of buckets of the latency histogram libdetshare keeps in a client page: bucket i
// counts completions that took [2^i, 2^(i+1)) microseconds (bucket 0 also holds everything below 1 µs, the last
// everything above).
const LatencyBuckets = 32

// MinLatencySamples is how many completions a window needs before its P99 is used for sizing.
const MinLatencySamples = 20

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
	for i := range cur {
		if cur[i] > prev[i] {
			// no process completes 2^40 requests in a window: a larger step is forged, and capping it keeps the
			// window's sums exact
			d[i] = min(cur[i]-prev[i], 1<<40)
		}
	}
	return d
}

// NextShrink sizes a busy, not pinned latency-critical tenant with an SLO from the P99 it observed in the last
// window: above the SLO it takes everything it can (shrink 0, and its neighbours get the tightest gate); above 80%
// of it it takes one group more; below half of it it gives one more group back to lower tiers (at most maxShrink,
// the groups it borrows). Without an SLO or enough samples it takes everything. The observed latency comes from
// the tenant's own page, so the worst a forged value can do is what a tenant without an SLO gets anyway.
func NextShrink(prev int, slo, p99 time.Duration, samples uint64, maxShrink int) (shrink int, miss bool) {
	if slo <= 0 || samples < MinLatencySamples || maxShrink <= 0 {
		return 0, false
	}
	switch {
	case p99 > slo:
		return 0, true
	case p99*5 > slo*4:
		prev--
	case p99*2 < slo:
		prev++
	}
	return min(max(prev, 0), maxShrink), false
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
