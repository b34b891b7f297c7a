package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `detshare doctor` on the cluster's node reports the Kubernetes platform it finds: kubelet's version (the one the
// apiserver reports), DetShare's device plugin registered with kubelet (15 SM-group units) and its DRA driver
// registered in kubelet's plugin registry, with the DRA features the apiserver serves (on 1.36: the plugin's probe).
func TestDoctorReportsTheNodesPlatform(t *testing.T) {
	c := need(t)
	ver, err := c.client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(c.build, "bin/detshare"), "--run-dir", c.runDir, "doctor", "--json", "--simulated-gpu",
		"--lib-dir", filepath.Join(c.build, "lib"), "--containerd-config", filepath.Join(c.dir, "containerd.toml"),
		"--kubelet-dir", c.kubeletRoot, "--device-plugin-dir", c.pluginDir, "--cdi-dir", c.cdiDir())
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(c.bin["kubelet"])+":"+os.Getenv("PATH"))
	out, _ := cmd.Output() // not ready here (no systemd unit, the test's own run directory): the report is what counts
	var r struct {
		Checks []struct{ Name, Status, Found string }
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("detshare doctor --json: %v: %s", err, out)
	}
	found := map[string]string{}
	for _, ch := range r.Checks {
		found[ch.Name] = ch.Status + " " + ch.Found
	}
	want := map[string]string{"kubernetes": "ok Kubernetes " + ver.GitVersion, "device plugins": "detshare.io/gpu: 15", "dra drivers": "gpu.detshare.io"}
	if c.consumable() { // what the DRA plugin's probe found, from its platform file
		want["dra drivers"] = "gpu.detshare.io found Kubernetes " + ver.GitVersion + " serving DRA features: consumableCapacity, partitionableDevices, deviceTaints"
	}
	for name, want := range want {
		if !strings.Contains(found[name], want) {
			t.Errorf("doctor %q: %q, want it to contain %q (report: %s)", name, found[name], want, out)
		}
	}
}
