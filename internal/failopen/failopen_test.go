package failopen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRecordCountsBoundsAndNeverCreatesTheRunDir(t *testing.T) {
	d := t.TempDir()
	missing := filepath.Join(d, "run")
	if err := Record(missing, "c1", errors.New("x")); err == nil {
		t.Error("recorded into a missing run dir")
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("Record created the run dir")
	}
	long := errors.New(strings.Repeat("A", 5000))
	for i := 0; i < 3; i++ {
		if err := Record(d, "c1", long); err != nil {
			t.Fatal(err)
		}
	}
	if n := Count(d); n != 3 {
		t.Errorf("count %d, want 3", n)
	}
	e, ok := Last(d)
	if !ok || e.ID != "c1" || len(e.Reason) > maxReason+4 {
		t.Errorf("last %+v (reason %d bytes): tenant input must be bounded", e, len(e.Reason))
	}
	os.WriteFile(filepath.Join(d, FileName), make([]byte, MaxBytes), 0o644)
	if err := Record(d, "c2", long); err == nil {
		t.Error("full log grew")
	}
}
