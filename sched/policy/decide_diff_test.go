package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/internal/table"
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
		t := Tenant{Slot: s, Tier: table.Tier(c.intn(3)), Role: table.Role(c.intn(3)), Weight: uint32(c.intn(6))}
		switch c.intn(64) {
		case 0:
			t.Slot = c.intn(len(ts))
		case 1:
			t.Tier = table.Tier(3)
		case 2:
			t.Role = table.Role(3)
		case 3:
			t.Weight = math.MaxUint32
		case 4:
			t.Weight = 1 << 20
		}
		if t.Tier != table.TierBestEffort || c.intn(8) == 0 {
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

// decideCases is how many generated inputs TestDecideMatchesGolden decides, in blocks of decideBlock.
const (
	decideCases = 200_000
	decideBlock = 10_000
)

// goldenFile holds one SHA-256 per block of generated inputs, over every field of every Decision (reasons
// included), as the Decide before its split into steps (commit a102816) decided them. The split was checked
// case by case against a verbatim copy of that code (200 000 inputs and a 60 s fuzz run) before the copy was
// dropped; this file keeps the proof without keeping the copy. A change that is meant to alter decisions
// regenerates it with DETSHARE_TEST_WRITE_GOLDEN=1.
const goldenFile = "testdata/decide_golden.txt"

// TestDecideMatchesGolden decides the generated inputs and compares each block's digest with goldenFile; it also
// checks that Decide leaves its tenants unmodified and that the generator reached every kind of decision (every
// reason Decide writes, the tight gate, mixed group sizes), so that a generator that drifted into trivial inputs
// fails instead of proving nothing.
func TestDecideMatchesGolden(t *testing.T) {
	got := decideDigests(t, Decide)
	if os.Getenv("DETSHARE_TEST_WRITE_GOLDEN") == "1" {
		if err := os.WriteFile(goldenFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	compareGolden(t, got)
}

// TestDeciderMatchesGolden decides the same inputs with one Decider, its buffers and reason cache reused from each
// input to the next (as the scheduler's loop uses it), and must match the same digests: reuse changes nothing.
func TestDeciderMatchesGolden(t *testing.T) {
	var dc Decider
	compareGolden(t, decideDigests(t, dc.Decide))
}

// decideDigests decides every generated input with decide and returns the digests, one line per block.
func decideDigests(t *testing.T, decide func([]uint32, []Tenant, Options) Decision) string {
	seen := map[string]int{}
	marks := []string{
		"guarantee cut to", "paused (", "throttled to", "reclaimed from lower tiers", "given back: latency inside",
		"pinned to its guarantee", "shared (weight", "decode first", "idle, guarantee kept", "idle, guarantee lent",
		"offered", "idle, paused", "idle, throttled to", "every group is reserved", "(board near its power limit",
		"latency-critical busy, board near", "above its SLO", "(latency-critical busy)",
	}
	r := rand.New(rand.NewSource(30))
	buf := make([]byte, 512)
	var digests []string
	h := sha256.New()
	for it := 0; it < decideCases; it++ {
		r.Read(buf)
		gs, ts, o := decideInput(&choices{b: buf})
		before := slices.Clone(ts)
		d := decide(gs, ts, o)
		if !slices.Equal(ts, before) {
			t.Fatalf("Decide modified its tenants:\n%+v\n%+v", before, ts)
		}
		fmt.Fprintf(h, "%d %#v\n", it, d)
		if (it+1)%decideBlock == 0 {
			digests = append(digests, hex.EncodeToString(h.Sum(nil)))
			h.Reset()
		}
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
	return strings.Join(digests, "\n") + "\n"
}

// compareGolden fails unless got (decideDigests) is goldenFile's digests.
func compareGolden(t *testing.T, got string) {
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	if w, g := strings.Fields(string(want)), strings.Fields(got); !slices.Equal(w, g) {
		for b := range g {
			if b >= len(w) || w[b] != g[b] {
				t.Fatalf("Decide's decisions changed: block %d (inputs %d..%d) differs from %s; a change meant to alter "+
					"decisions regenerates it (DETSHARE_TEST_WRITE_GOLDEN=1), any other is a regression",
					b, b*decideBlock, (b+1)*decideBlock-1, goldenFile)
			}
		}
		t.Fatalf("%s has %d blocks, Decide gave %d", goldenFile, len(w), len(g))
	}
}
