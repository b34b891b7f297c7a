package libdetshare_test

import (
	"encoding/binary"
	"os"
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/table"
)

// pageAttack is one way a tenant damages its own client page before a process starts (issue 27: "a tenant switches
// DetShare off for its own later processes with 8 bytes").
type pageAttack struct {
	name string
	do   func(t *testing.T, path string)
}

func writeAt(off int64, b []byte) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

var pageAttacks = []pageAttack{
	{"magic", writeAt(0, []byte("garbage!"))},
	{"abi version", writeAt(8, le32(table.ABIVersion+1))},
	{"slot", writeAt(12, le32(7))},
	{"generation", writeAt(16, le32(12345))},
	{"process entries", writeAt(20, le32(0))},
	{"truncated", func(t *testing.T, path string) {
		if err := os.Truncate(path, 100); err != nil {
			t.Fatal(err)
		}
	}},
	{"emptied", func(t *testing.T, path string) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
	}},
}

// TestDamagedClientPageFailsClosed is issue 27's first attack: the tenant overwrites the magic, ABI version, slot,
// generation or entry count of its read-write client page, or truncates it, before a process starts. Before the fix
// the library logged "DetShare disabled in this process (fail-open)" and the process ran with no memory quota, no SM
// confinement and outside MPS (a 32 MiB allocation in a 16 MiB tenant succeeded). Now the process's CUDA work is
// refused (cuInit: CUDA_ERROR_NOT_PERMITTED, through both driver paths), and once the scheduler's housekeeping has
// repaired the page from the table (RepairClientPages) the tenant's next process runs under its quota again.
func TestDamagedClientPageFailsClosed(t *testing.T) {
	for _, a := range pageAttacks {
		t.Run(a.name, func(t *testing.T) {
			e := newEnv(t, true).withTenant(16*MiB, "")
			a.do(t, e.reg.ClientPagePath)
			for _, prog := range probes {
				r := e.run(prog, "init", "alloc:33554432", "alloc:8388608")
				out := strings.Join(r.lines, "\n")
				if rc := r.get(t, "init", "rc"); rc != "800" {
					t.Errorf("%s after the %s was damaged: init rc %s, want 800 (CUDA_ERROR_NOT_PERMITTED):\n%s",
						prog, a.name, rc, out)
				}
				for _, step := range []string{"alloc:33554432", "alloc:8388608"} {
					if rc := r.get(t, step, "rc"); rc == "0" {
						t.Errorf("%s: %s succeeded in a refused process:\n%s", prog, step, out)
					}
				}
				if !strings.Contains(out, "refuses this process's CUDA work") || !strings.Contains(out, "client page") {
					t.Errorf("%s: the refusal does not name the client page:\n%s", prog, out)
				}
				if strings.Contains(out, "fail-open") && !strings.Contains(out, "fail-closed") {
					t.Errorf("%s: the library still fails open:\n%s", prog, out)
				}
			}
			reps, err := e.tbl.RepairClientPages()
			if err != nil || len(reps) != 1 || reps[0].ID != e.reg.ID {
				t.Fatalf("repair: %+v, %v; want the tenant's page repaired", reps, err)
			}
			if again, err := e.tbl.RepairClientPages(); err != nil || len(again) != 0 {
				t.Fatalf("a second repair found more to do: %+v, %v", again, err)
			}
			r := e.run("ds_probe_rt", "init", "alloc:33554432", "alloc:8388608")
			if rc := r.get(t, "init", "rc"); rc != "0" {
				t.Fatalf("after the repair: init rc %s:\n%s", rc, strings.Join(r.lines, "\n"))
			}
			if r.get(t, "alloc:33554432", "rc") != "2" || r.get(t, "alloc:8388608", "rc") != "0" {
				t.Fatalf("after the repair the 16 MiB quota does not hold:\n%s", strings.Join(r.lines, "\n"))
			}
		})
	}
}

// A process that drops privileges and can neither open its page nor use an inherited descriptor is refused too
// (before: "running unshared" without its quota).
func TestUnreachableClientPageFailsClosed(t *testing.T) {
	e := newEnv(t, true).withTenant(16*MiB, "")
	if err := os.Remove(e.reg.ClientPagePath); err != nil {
		t.Fatal(err)
	}
	r := e.run("ds_probe_rt", "init", "alloc:33554432")
	if rc := r.get(t, "init", "rc"); rc != "800" || r.get(t, "alloc:33554432", "rc") == "0" {
		t.Fatalf("a process whose client page is missing was not refused:\n%s", strings.Join(r.lines, "\n"))
	}
}
