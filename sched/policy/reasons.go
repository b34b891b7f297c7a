package policy

import (
	"fmt"
	"time"
)

// A grant's reason is one of a few dozen strings for a given host (its numbers are group counts, a gate and a
// guarantee), yet formatting it anew for every tenant on every pass was most of what a pass allocated. A pass
// chooses each reason as a reasonKey (which sentence, with which numbers) and reasonCache formats each distinct key
// once, handing out the same string afterwards.

// Reason sentences (reasonKey.site).
const (
	reasonNone          uint8 = iota
	reasonCut                 // guarantee cut to a of b groups
	reasonPaused              // busy lower tier paused (why)
	reasonThrottled           // busy lower tier throttled to a groups (why), gate b kernels / c ns
	reasonReclaimed           // busy LC: guarantee a + b reclaimed, c given back
	reasonPinned              // busy pinned LC on its guarantee a
	reasonBusy                // busy: guarantee a (-1: none mentioned) + b shared (weight c), d = 1 decode first
	reasonIdlePaused          // idle lower tier paused (why)
	reasonIdleThrottled       // idle lower tier throttled to a groups (why)
	reasonIdleReserved        // idle, every group reserved
	reasonIdle                // idle
	reasonKept                // idle with its guarantee: see keptWhy
)

// What throttles lower tiers (reasonKey.why).
const (
	whyLC uint8 = iota
	whyPower
	whyLCPower
	whySLO
)

var whys = [...]string{
	whyLC:      "latency-critical busy",
	whyPower:   "board near its power limit",
	whyLCPower: "latency-critical busy, board near its power limit",
	whySLO:     "latency-critical busy above its SLO",
}

// reasonKey is a reason before formatting: a sentence and its numbers. Integers only, so that looking one up
// hashes a few words.
type reasonKey struct {
	site       uint8
	why        uint8
	a, b, c, d int64
}

// format writes the reason k stands for.
func (k reasonKey) format() string {
	why := whys[k.why]
	switch k.site {
	case reasonCut:
		return fmt.Sprintf("guarantee cut to %d of %d groups (not enough groups)", k.a, k.b)
	case reasonPaused:
		return fmt.Sprintf("paused (%s, floor 0)", why)
	case reasonThrottled:
		return fmt.Sprintf("throttled to %d groups (%s), gate %d kernels / %s per stream", k.a, why, k.b, time.Duration(k.c))
	case reasonReclaimed:
		s := fmt.Sprintf("busy, guarantee %d + %d reclaimed from lower tiers", k.a, k.b)
		if k.c > 0 {
			s += fmt.Sprintf(" (%d given back: latency inside its SLO)", k.c)
		}
		return s
	case reasonPinned:
		return fmt.Sprintf("busy, pinned to its guarantee %d", k.a)
	case reasonBusy:
		s := "busy"
		if k.a >= 0 {
			s = fmt.Sprintf("busy, guarantee %d", k.a)
		}
		if k.b > 0 {
			s += fmt.Sprintf(" + %d shared (weight %d", k.b, k.c)
			if k.d != 0 {
				s += ", decode first"
			}
			s += ")"
		}
		return s
	case reasonIdlePaused:
		return fmt.Sprintf("idle, paused (%s)", why)
	case reasonIdleThrottled:
		return fmt.Sprintf("idle, throttled to %d groups (%s)", k.a, why)
	case reasonIdleReserved:
		return "idle, every group is reserved"
	case reasonIdle:
		return "idle"
	case reasonKept:
		var s string
		switch k.a {
		case 0:
			s = reasonKey{site: reasonCut, a: k.b, b: k.c}.format()
		case 1:
			s = "idle, guarantee kept"
		default:
			s = "idle, guarantee lent"
		}
		if k.d > 0 {
			s += fmt.Sprintf(", offered %d more groups to start wide", k.d)
		}
		return s
	}
	return ""
}

// maxReasons bounds the cache: past it the cache starts over (a host whose reasons vary that much is rare, and
// starting over costs only the formatting).
const maxReasons = 1 << 12

// reasonCache maps a reasonKey to its text. The zero value is ready.
type reasonCache struct {
	m map[reasonKey]string
}

// text is k.format(), formatted once per distinct key.
func (c *reasonCache) text(k reasonKey) string {
	if s, ok := c.m[k]; ok {
		return s
	}
	s := k.format()
	if c.m == nil || len(c.m) >= maxReasons {
		c.m = make(map[reasonKey]string)
	}
	c.m[k] = s
	return s
}
