package quote

import (
	"strings"
	"testing"
)

func TestQBoundsLongInput(t *testing.T) {
	if got := Q("gold"); got != `"gold"` {
		t.Errorf("short input: %s", got)
	}
	long := strings.Repeat("é", 1<<19) // 1 MiB of 2-byte characters
	got := Q(long)
	if len(got) > 3*Max || !strings.HasSuffix(got, "…(1048576 bytes)") {
		t.Errorf("1 MiB quoted as %d bytes: %.200s", len(got), got)
	}
	if strings.Contains(got, `\x`) {
		t.Errorf("cut inside a character: %s", got)
	}
	if b := Bounded(long); len(b) > 2*Max || !strings.HasSuffix(b, "(1048576 bytes)") {
		t.Errorf("Bounded: %d bytes", len(b))
	}
	if b := Bounded("abc"); b != "abc" {
		t.Errorf("Bounded short: %s", b)
	}
}
