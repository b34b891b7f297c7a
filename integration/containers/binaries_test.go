package containers

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The hook, the wrapper and the shim run on every container start, on hosts with or without the NVIDIA driver:
// they must not link go-nvml (DESIGN.md §2: it dies at start without the driver) and must start here, where there
// is no driver.
func TestBinariesStartWithoutDriverAndLackNVML(t *testing.T) {
	e := need(t)
	for _, c := range []struct {
		bin  string
		args []string
		want string
	}{
		{"detshare-hook", []string{"--help"}, "OCI hook"},
		{"detshare-runtime", []string{"--version"}, "runc version"},
		{"containerd-shim-detshare-v1", []string{"-v"}, "containerd-shim-detshare-v1"},
	} {
		p := filepath.Join(e.bin, c.bin)
		out, err := run(20*time.Second, nil, p, c.args...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("%s %v: %v\n%s", c.bin, c.args, err, out)
		}
		mods, err := exec.Command("go", "version", "-m", p).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v", p, err)
		}
		if strings.Contains(string(mods), "go-nvml") {
			t.Errorf("%s links go-nvml", c.bin)
		}
	}
}
