// Package startup checks that every DetShare binary starts on a host without the NVIDIA driver (CI is one).
// A Go binary that links go-nvml with immediate binding dies before main there (DESIGN.md §2); the Makefile
// links lazily, and this test keeps it that way.
package startup

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// buildDir is DETSHARE_BUILD_DIR or the repository's build/.
func buildDir(t *testing.T) string {
	if d := os.Getenv("DETSHARE_BUILD_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "build")
}

func TestEveryBinaryStartsWithoutNVIDIADriver(t *testing.T) {
	bins, _ := filepath.Glob(filepath.Join(buildDir(t), "bin", "*"))
	if len(bins) == 0 {
		t.Fatalf("no binaries in %s/bin: run `make build` first", buildDir(t))
	}
	for _, b := range bins {
		out, err := exec.Command(b, "--help").CombinedOutput()
		s := string(out)
		if strings.Contains(s, "symbol lookup error") || strings.Contains(s, "error while loading shared libraries") {
			t.Errorf("%s does not start without the driver:\n%s", filepath.Base(b), s)
			continue
		}
		if err != nil && !strings.Contains(strings.ToLower(s), "usage") {
			t.Errorf("%s --help failed: %v\n%s", filepath.Base(b), err, s)
		}
	}
}

func TestDoctorReportsMissingDriverAndExitsNonZero(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver; the no-driver path is exercised in CI")
	}
	bin := filepath.Join(buildDir(t), "bin", "detshare")
	out, err := exec.Command(bin, "doctor").CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("doctor without a driver: want exit 1, got %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "no NVIDIA driver") {
		t.Fatalf("doctor output does not name the missing driver:\n%s", out)
	}
}
