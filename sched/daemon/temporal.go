package daemon

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/sched/policy"
	"github.com/detshare/detshare/sched/table"
)

// decideTemporal hands the GPU's time token around the busy tenants. Every tenant's grant says temporal mode over
// the whole split; the token says who may run now. A latency-critical tenant that becomes busy takes the token at
// once from a lower tier (the holder finishes its in-flight kernel; nothing is preempted).
func (s *Scheduler) decideTemporal(g table.GPUState, gs *gpuState, rows []tenantRow, popt policy.Options, now time.Time) {
	var all uint64
	for i := range g.Split.Groups {
		all |= 1 << i
	}
	ts := make([]policy.Tenant, len(rows))
	for i, r := range rows {
		ts[i] = toPolicy(r)
		s.publish(r, table.Grant{Groups: all, SMs: g.Split.TotalSMs(), Mode: table.ModeTemporal}, "temporal: runs while holding the token")
	}
	turns := policy.Rotation(ts, popt)
	tierOf := map[int]policy.Tier{}
	genOf := map[int]uint32{}
	for i, r := range rows {
		tierOf[r.reg.Slot] = ts[i].Tier
		genOf[r.reg.Slot] = r.reg.Gen
	}
	pos := -1
	for i, tn := range turns {
		if tn.Slot == gs.holder && genOf[tn.Slot] == gs.holdGen {
			pos = i
		}
	}
	next := -1
	switch {
	case len(turns) == 0:
		next = -1
	case pos < 0:
		next = 0
	case tierOf[turns[0].Slot] > tierOf[gs.holder]:
		next = 0 // a higher tier became busy: it goes first
	case !now.Before(gs.until):
		next = (pos + 1) % len(turns)
	default:
		return // quantum not over
	}
	if next < 0 {
		if gs.holder >= 0 {
			gs.holder = -1
			_ = s.t.PublishToken(g.Index, -1, 0)
		}
		return
	}
	tn := turns[next]
	if tn.Slot == gs.holder && pos == next && genOf[tn.Slot] == gs.holdGen {
		gs.until = now.Add(tn.Quantum) // alone: keep it, extend
		_ = s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum))
		return
	}
	gs.holder, gs.holdGen, gs.until = tn.Slot, genOf[tn.Slot], now.Add(tn.Quantum)
	if err := s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum)); err != nil {
		logrus.WithError(err).WithField("gpu", g.Index).Warn("publish token")
		return
	}
	s.stats.TokenHandoffs.Add(1)
}
