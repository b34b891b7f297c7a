package policy

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// choices turns bytes into the choices of an input generator; past the end every choice is 0, so that any byte
// string (a fuzzer's included) decodes to a valid input.
type choices struct {
	b []byte
	i int
}

func (c *choices) byte() byte {
	if c.i >= len(c.b) {
		return 0
	}
	c.i++
	return c.b[c.i-1]
}

// intn is a choice in [0, n) for n <= 256.
func (c *choices) intn(n int) int { return int(c.byte()) % n }

func (c *choices) u64() uint64 {
	var x uint64
	for range 8 {
		x = x<<8 | uint64(c.byte())
	}
	return x
}

// decideInput decodes one input of Decide: 1..16 groups (now and then none, or 17..70 so that the 64-group cap is
// crossed), uniform or mixed group sizes, 0..12 tenants of every tier with or without guarantees (over-subscribed
// ones included), busy or idle, lending, pinned, weights (0 and huge ones included), roles, shrink, SLO misses, held
// groups, and options (both kinds, decode boost, floors including negative ones, gate depth and budget including
// unset ones, the power limit). Values outside what the daemon sends (a tier or role past the last, duplicate slots)
// appear too: the claim is that the split changed nothing on any input.
func decideInput(c *choices) ([]uint32, []Tenant, Options) {
	n := 1 + c.intn(16)
	switch c.intn(32) {
	case 0:
		n = 0
	case 1:
		n = 17 + c.intn(54)
	case 2:
		n = 64
	}
	gs := make([]uint32, n)
	sms := uint32(1 + c.intn(16))
	mixed := c.intn(4) == 0
	for i := range gs {
		gs[i] = sms
		if mixed {
			gs[i] = uint32(1 + c.intn(16))
		}
	}
	all := ^uint64(0)
	if n < 64 {
		all = 1<<n - 1
	}
	ts := make([]Tenant, c.intn(13))
	for s := range ts {
		t := Tenant{Slot: s, Tier: Tier(c.intn(3)), Role: Role(c.intn(3)), Weight: uint32(c.intn(6))}
		switch c.intn(64) {
		case 0:
			t.Slot = c.intn(len(ts))
		case 1:
			t.Tier = Tier(3)
		case 2:
			t.Role = Role(3)
		case 3:
			t.Weight = math.MaxUint32
		case 4:
			t.Weight = 1 << 20
		}
		if t.Tier != BestEffort || c.intn(8) == 0 {
			t.Guarantee = c.intn(n/2+3) - c.intn(2)
		}
		f := c.byte()
		t.Lend, t.Busy, t.Pinned, t.SLOMiss = f&1 != 0, f&2 != 0, f&4 != 0 && f&8 != 0, f&16 != 0 && f&32 != 0
		switch c.intn(4) {
		case 0:
		case 1:
			t.Prev = c.u64()
		default:
			t.Prev = c.u64() & all
		}
		if c.intn(3) == 0 {
			t.Shrink = c.intn(n+2) - 1
		}
		ts[s] = t
	}
	o := DefaultOptions()
	if c.intn(2) == 0 {
		o.Kind = TPOTFirst
	}
	o.DecodeBoost = uint32(c.intn(5))
	o.Floor = c.intn(5) - 1
	o.GateDepth = uint32(c.intn(10))
	switch c.intn(4) {
	case 0:
		o.GateBudget = 0
	case 1:
		o.GateBudget = time.Duration(c.intn(256)) * 10 * time.Microsecond
	}
	o.PowerNearLimit = c.intn(4) == 0
	return gs, ts, o
}

// matchOld decides the input with both Decide and decideOld and fails on any difference, in any field of the
// Decision (reasons included) or in the tenants given (neither may modify them).
func matchOld(t *testing.T, gs []uint32, ts []Tenant, o Options) Decision {
	t.Helper()
	before := slices.Clone(ts)
	want := decideOld(gs, slices.Clone(ts), o)
	got := Decide(gs, ts, o)
	if !slices.Equal(ts, before) {
		t.Fatalf("Decide modified its tenants:\n%+v\n%+v", before, ts)
	}
	if reflect.DeepEqual(got, want) {
		return got
	}
	var diff []string
	if (got.Grants == nil) != (want.Grants == nil) || (got.Exclusive == nil) != (want.Exclusive == nil) ||
		len(got.Grants) != len(want.Grants) || len(got.Exclusive) != len(want.Exclusive) {
		diff = append(diff, fmt.Sprintf("shape: grants %d (nil %v) exclusive %d (nil %v), old %d (nil %v) %d (nil %v)",
			len(got.Grants), got.Grants == nil, len(got.Exclusive), got.Exclusive == nil,
			len(want.Grants), want.Grants == nil, len(want.Exclusive), want.Exclusive == nil))
	} else {
		for i := range got.Grants {
			if got.Grants[i] != want.Grants[i] {
				diff = append(diff, fmt.Sprintf("tenant %d grant %+v, old %+v", i, got.Grants[i], want.Grants[i]))
			}
			if got.Exclusive[i] != want.Exclusive[i] {
				diff = append(diff, fmt.Sprintf("tenant %d exclusive %#x, old %#x", i, got.Exclusive[i], want.Exclusive[i]))
			}
		}
	}
	t.Fatalf("Decide differs from decideOld on groups %v options %+v tenants\n%+v:\n%s", gs, o, ts, strings.Join(diff, "\n"))
	return got
}

// decideCases is how many generated inputs TestDecideMatchesOld compares.
const decideCases = 200_000

// TestDecideMatchesOld compares Decide with the copy of the code it replaced on generated inputs, and checks that
// the generator reached every kind of decision (every reason Decide writes, the tight gate, mixed group sizes), so
// that a generator that drifted into trivial inputs fails instead of proving nothing.
func TestDecideMatchesOld(t *testing.T) {
	seen := map[string]int{}
	marks := []string{
		"guarantee cut to", "paused (", "throttled to", "reclaimed from lower tiers", "given back: latency inside",
		"pinned to its guarantee", "shared (weight", "decode first", "idle, guarantee kept", "idle, guarantee lent",
		"offered", "idle, paused", "idle, throttled to", "every group is reserved", "(board near its power limit",
		"latency-critical busy, board near", "above its SLO", "(latency-critical busy)",
	}
	r := rand.New(rand.NewSource(30))
	buf := make([]byte, 512)
	for it := 0; it < decideCases; it++ {
		r.Read(buf)
		gs, ts, o := decideInput(&choices{b: buf})
		d := matchOld(t, gs, ts, o)
		for i, g := range d.Grants {
			for _, m := range marks {
				if strings.Contains(g.Reason, m) {
					seen[m]++
				}
			}
			if g.Reason == "idle" || g.Reason == "busy" {
				seen[g.Reason]++
			}
			if g.Gate.Depth == 1 {
				seen["tight gate"]++
			}
			if ts[i].Busy && g.Groups == 0 {
				seen["busy without groups"]++
			}
		}
		if len(gs) > 0 && slices.Min(gs) != slices.Max(gs) {
			seen["mixed group sizes"]++
		}
		if len(gs) > 64 {
			seen["more than 64 groups"]++
		}
	}
	for _, m := range append(marks, "idle", "busy", "tight gate", "busy without groups", "mixed group sizes", "more than 64 groups") {
		if seen[m] < 20 {
			t.Errorf("the generator reached %q only %d times in %d cases", m, seen[m], decideCases)
		}
	}
}

// FuzzDecideMatchesOld is TestDecideMatchesOld driven by the fuzzer's bytes (go test -fuzz FuzzDecideMatchesOld).
func FuzzDecideMatchesOld(f *testing.F) {
	r := rand.New(rand.NewSource(31))
	for range 16 {
		b := make([]byte, 64+r.Intn(400))
		r.Read(b)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		gs, ts, o := decideInput(&choices{b: b})
		matchOld(t, gs, ts, o)
	})
}
