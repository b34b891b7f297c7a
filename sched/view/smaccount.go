package view

import (
	"fmt"
	"sort"
	"strings"
)

// SM accounting. Grants are not a partition: the policy lets them overlap while the tenants involved are idle (an
// idle tenant without a guarantee keeps its share of the shared groups, an idle lender keeps its grant while the same
// groups are lent to busy borrowers, an idle expanding latency-critical tenant is offered every group nobody else
// holds; under scheduler.lc_overlap a sized latency-critical tenant runs on its neighbours' groups too, and under
// share_overlap busy sharers run on the same groups), and in temporal mode every grant is the GPU taken in turns (by the token, or by the driver under share_overlap). So the granted SMs of a GPU's tenants can add up
// to more than the GPU has; status and top show guarantees, what is granted beyond them, and which groups are
// granted to several tenants, instead of a sum that makes no sense.

// SMAccount explains one GPU's SMs.
type SMAccount struct {
	Total      uint32         `json:"sms"`
	Guaranteed uint32         `json:"guaranteed_sms"` // sum of the tenants' guarantees
	Granted    uint32         `json:"granted_sms"`    // SMs in at least one grant (each counted once)
	Beyond     uint32         `json:"beyond_guarantee_sms"`
	Free       uint32         `json:"free_sms"` // in no grant (the split's leftover SMs run with its last group)
	Shared     []SharedGroups `json:"shared,omitempty"`
	SharedSMs  uint32         `json:"shared_sms"` // SMs in groups granted to more than one tenant
}

// SharedGroups are groups granted to the same set of several tenants.
type SharedGroups struct {
	Groups  []int    `json:"groups"`
	SMs     uint32   `json:"sms"`
	Tenants []string `json:"tenants"`
}

// groupSMs sums the SMs of the groups in mask.
func groupSMs(g GPU, mask uint64) uint32 {
	var n uint32
	for i, sz := range g.Groups {
		if i < 64 && mask&(1<<uint(i)) != 0 {
			n += sz
		}
	}
	return n
}

// Account fills the tenants' BorrowedSMs, SharedSMs and SharesWith (tenants of other GPUs are left alone) and returns
// the GPU's account.
func Account(g GPU, tenants []Tenant) SMAccount {
	a := SMAccount{Total: g.SMs}
	var union uint64
	holders := map[int][]int{} // group -> indexes into tenants
	for i := range tenants {
		t := &tenants[i]
		if t.GPU != g.Index {
			continue
		}
		a.Guaranteed += t.GuaranteedSMs
		if t.GrantedSMs > t.GuaranteedSMs {
			t.BorrowedSMs = t.GrantedSMs - t.GuaranteedSMs
		} else {
			t.BorrowedSMs = 0
		}
		a.Beyond += t.BorrowedSMs
		union |= t.GrantGroups
		for b := 0; b < len(g.Groups) && b < 64; b++ {
			if t.GrantGroups&(1<<uint(b)) != 0 {
				holders[b] = append(holders[b], i)
			}
		}
	}
	a.Granted = groupSMs(g, union)
	if a.Granted < g.SMs {
		a.Free = g.SMs - a.Granted
	}
	bySet := map[string]*SharedGroups{}
	var keys []string
	for b := 0; b < len(g.Groups) && b < 64; b++ {
		hs := holders[b]
		if len(hs) < 2 {
			continue
		}
		a.SharedSMs += g.Groups[b]
		var ids []string
		for _, i := range hs {
			tenants[i].SharedSMs += g.Groups[b]
			ids = append(ids, tenants[i].ID)
			for _, j := range hs {
				if j != i && !contains(tenants[i].SharesWith, tenants[j].ID) {
					tenants[i].SharesWith = append(tenants[i].SharesWith, tenants[j].ID)
				}
			}
		}
		k := strings.Join(ids, "\x00")
		sg, ok := bySet[k]
		if !ok {
			sg = &SharedGroups{Tenants: ids}
			bySet[k] = sg
			keys = append(keys, k)
		}
		sg.Groups = append(sg.Groups, b)
		sg.SMs += g.Groups[b]
	}
	for _, k := range keys {
		a.Shared = append(a.Shared, *bySet[k])
	}
	for i := range tenants {
		sort.Strings(tenants[i].SharesWith)
	}
	return a
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// AccountAll fills every GPU's Account and the tenants' SM fields (Take does; so must a hand-made Snapshot).
func AccountAll(s *Snapshot) {
	for i := range s.Tenants {
		s.Tenants[i].BorrowedSMs, s.Tenants[i].SharedSMs, s.Tenants[i].SharesWith = 0, 0, nil
	}
	for i := range s.GPUs {
		s.GPUs[i].Account = Account(s.GPUs[i], s.Tenants)
	}
}

// GroupRanges writes group indexes as ranges: [0 1 2 5] is "0-2,5".
func GroupRanges(gs []int) string {
	var parts []string
	for i := 0; i < len(gs); {
		j := i
		for j+1 < len(gs) && gs[j+1] == gs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(gs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", gs[i], gs[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// AccountLines is the account in words, for status and top: a summary line, then one line per set of groups granted
// to several tenants, naming them (and which of them are idle: Demand 0).
func AccountLines(g GPU, a SMAccount, tenants []Tenant) []string {
	out := []string{fmt.Sprintf("%d SMs: %d guaranteed, %d borrowed, %d granted (each SM once), %d free",
		a.Total, a.Guaranteed, a.Beyond, a.Granted, a.Free)}
	if len(a.Shared) == 0 {
		return out
	}
	busy := map[string]bool{}
	driverSliced := false
	for _, t := range tenants {
		if t.GPU == g.Index {
			busy[t.ID] = t.Demand > 0
			driverSliced = driverSliced || t.GrantMode == "unrestricted"
		}
	}
	why := "overlap: tenants idle, lending or sharing"
	switch {
	case g.Mode == "temporal" && driverSliced:
		why = "temporal mode, share_overlap: the driver time-slices them"
	case g.Mode == "temporal":
		why = "temporal mode: they take turns"
	}
	out = append(out, fmt.Sprintf("%d SMs granted to 2+ tenants (%s):", a.SharedSMs, why))
	for _, s := range a.Shared {
		names := make([]string, len(s.Tenants))
		for i, id := range s.Tenants {
			names[i] = id
			if !busy[id] {
				names[i] += " (idle)"
			}
		}
		out = append(out, fmt.Sprintf("  groups %s (%d SMs): %s", GroupRanges(s.Groups), s.SMs, strings.Join(names, ", ")))
	}
	return out
}
