package daemon

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/policy"
)

// token is where a GPU without MPS stands in its time-token rotation. The table holds the same in clock-monotonic
// terms for the tenants; this copy is what the loop (its only user) decides from.
type token struct {
	holder  int // slot holding the token, -1 none
	holdGen uint32
	until   time.Time
}

// resume starts from the token a previous leader published, so that a takeover does not cut a quantum short.
func (tk *token) resume(tok table.Token) {
	tk.holder = -1
	if tok.Holder >= 0 {
		tk.holder, tk.holdGen = tok.Holder, tok.HolderGen
		tk.until = time.Now().Add(time.Duration(int64(tok.DeadlineNs) - int64(table.MonotonicNs())))
	}
}

// left is the time until the holder's quantum ends; held is false when nobody holds the token.
func (tk *token) left() (d time.Duration, held bool) {
	if tk.holder < 0 {
		return 0, false
	}
	return time.Until(tk.until), true
}

// decideTemporal hands the GPU's time token around the busy tenants. Every tenant's grant says temporal mode over
// the whole split; the token says who may run now. A latency-critical tenant that becomes busy takes the token at
// once from a lower tier (the holder finishes its in-flight kernels, which its dispatch gate bounds; nothing is
// preempted), and launches meanwhile without waiting for the hand-over (ds_grant.c). Under share_overlap with
// nobody latency-critical registered there is no token: every grant is unrestricted and the driver time-slices the
// tenants (policy.TemporalTimeSliced).
func (s *Scheduler) decideTemporal(g table.GPUState, tk *token, rows []tenantRow, popt policy.Options, now time.Time) {
	var all uint64
	for i := range g.Split.Groups {
		all |= 1 << i
	}
	ts := make([]policy.Tenant, len(rows))
	for i := range rows {
		ts[i] = toPolicy(&rows[i])
	}
	slo := s.Config().Scheduler.LatencySLO.Duration
	if policy.TemporalTimeSliced(ts, popt) {
		// share_overlap with nobody latency-critical: the driver time-slices them; no token, no gate
		for i := range rows {
			s.setGate(&rows[i], policy.Gate{})
			s.setNarrow(&rows[i], 0)
			s.publish(&rows[i], table.Grant{Groups: all, SMs: g.Split.TotalSMs(), Mode: table.ModeUnrestricted},
				"temporal, share_overlap: time-sliced by the driver", slo)
		}
		if tk.holder >= 0 {
			tk.holder = -1
			_ = s.t.PublishToken(g.Index, -1, 0)
		}
		return
	}
	for i := range rows {
		s.publish(&rows[i], table.Grant{Groups: all, SMs: g.Split.TotalSMs(), Mode: table.ModeTemporal}, "temporal: runs while holding the token", slo)
	}
	for i, gate := range policy.TemporalGates(ts, popt) {
		s.setGate(&rows[i], gate)
		s.setNarrow(&rows[i], 0) // a time slice runs on every SM
	}
	turns := policy.Rotation(ts, popt)
	tierOf := map[int]table.Tier{}
	genOf := map[int]uint32{}
	for i := range rows {
		tierOf[rows[i].reg.Slot] = ts[i].Tier
		genOf[rows[i].reg.Slot] = rows[i].reg.Gen
	}
	pos := -1
	for i, tn := range turns {
		if tn.Slot == tk.holder && genOf[tn.Slot] == tk.holdGen {
			pos = i
		}
	}
	next := -1
	switch {
	case len(turns) == 0:
		next = -1
	case pos < 0:
		next = 0
	case tierOf[turns[0].Slot] > tierOf[tk.holder]:
		next = 0 // a higher tier became busy: it goes first
	case !now.Before(tk.until):
		next = (pos + 1) % len(turns)
	default:
		return // quantum not over
	}
	if next < 0 {
		if tk.holder >= 0 {
			tk.holder = -1
			_ = s.t.PublishToken(g.Index, -1, 0)
		}
		return
	}
	tn := turns[next]
	if tn.Slot == tk.holder && pos == next && genOf[tn.Slot] == tk.holdGen {
		tk.until = now.Add(tn.Quantum) // alone: keep it, extend
		_ = s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum))
		return
	}
	tk.holder, tk.holdGen, tk.until = tn.Slot, genOf[tn.Slot], now.Add(tn.Quantum)
	if err := s.t.PublishToken(g.Index, tn.Slot, table.MonotonicNs()+uint64(tn.Quantum)); err != nil {
		logrus.WithError(err).WithField("gpu", g.Index).Warn("publish token")
		return
	}
	s.stats.TokenHandoffs.Add(1)
}
