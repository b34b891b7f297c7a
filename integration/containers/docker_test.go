package containers

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/integration/testenv"
	"github.com/detshare/detshare/internal/table"
)

const dockerImage = "detshare-e2e:test"

func needDocker(t *testing.T) *env {
	t.Helper()
	e := need(t)
	if err := e.startDocker(); err != nil {
		t.Fatalf("dockerd not available: %v", err)
	}
	return e
}

func TestDockerRunEnvLabelExecAndKill(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "-d", "--runtime=detshare", "--network", "none", "--name", "ds-docker-env",
		"-e", "DETSHARE_TIER=burstable", "-e", "DETSHARE_MEMORY=1GiB", "-e", "DETSHARE_SMS=16",
		"--label", "detshare.io/weight=5", dockerImage, "sh", "-c", "simgpu-probe meminfo > /tmp/main.out 2>&1; exec sleep 300")
	if err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	id := strings.TrimSpace(out)
	defer e.docker("rm", "-f", id)
	r := e.waitRegistered(t, id)
	if r.MemLimit != 1<<30 || r.SMs < 16 || r.Weight != 5 || r.Tier != table.TierBurstable {
		t.Errorf("registration %+v: want burstable, >=16 SMs, 1 GiB (env), weight 5 (Docker label)", r)
	}
	exec := func(args ...string) (string, error) { return e.docker(append([]string{"exec", id}, args...)...) }
	checkInside(t, exec, id, 1<<30)
	var main string
	for i := 0; i < 50; i++ {
		if main, _ = exec("cat", "/tmp/main.out"); strings.Contains(main, "meminfo") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := meminfoTotal(t, main); got != 1<<30 {
		t.Errorf("main process sees %d bytes, want the quota", got)
	}
	if out, err := e.docker("kill", id); err != nil {
		t.Fatalf("docker kill: %v: %s", err, out)
	}
	// Deregistered on kill, before the container is removed (runc delete runs the poststop hook).
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, ok := e.lookup(t, id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still registered 15s after docker kill")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := e.docker("rm", id); err != nil {
		t.Fatalf("docker rm: %v: %s", err, out)
	}
	e.assertNoLeak(t, id)
}

func TestDockerLabelTierAndExit(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "--runtime=detshare", "--network", "none", "--name", "ds-docker-label",
		"--label", "detshare.io/tier=latency-critical", "--label", "detshare.io/sms=16",
		"--label", "detshare.io/memory=256MiB", dockerImage, "sh", "-c", "simgpu-probe meminfo; "+testenv.OwnTierScript())
	if err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	id := dockerID(t, e, "ds-docker-label")
	defer e.docker("rm", "-f", id)
	if got := meminfoTotal(t, out); got != 256<<20 {
		t.Errorf("main process sees %d bytes, want 256 MiB", got)
	}
	if !strings.Contains(out, testenv.TierLine(table.TierLatencyCritical)) {
		t.Errorf("tier from the Docker label did not arrive:\n%s", out)
	}
	e.docker("rm", id)
	e.assertNoLeak(t, id)
}

func dockerID(t *testing.T, e *env, name string) string {
	t.Helper()
	out, err := e.docker("inspect", "-f", "{{.Id}}", name)
	if err != nil {
		t.Fatalf("docker inspect %s: %v: %s", name, err, out)
	}
	return strings.TrimSpace(out)
}

func TestDockerPlainContainerRunsAsUnderRunc(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "--rm", "--runtime=detshare", "--network", "none", dockerImage, "sh", "-c",
		"simgpu-probe meminfo; test -e /run/detshare/quota && echo MOUNTED || echo NOT-MOUNTED")
	if err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	if got := meminfoTotal(t, out); got != simTotal {
		t.Errorf("plain container sees %d bytes, want %d", got, uint64(simTotal))
	}
	if !strings.Contains(out, "NOT-MOUNTED") {
		t.Errorf("plain container got DetShare mounts:\n%s", out)
	}
	if ids := e.registered(t); len(ids) != 0 {
		t.Errorf("tenants registered after a plain run: %v", ids)
	}
}

func TestDockerBadQuotaRefusedAndNothingLeaks(t *testing.T) {
	e := needDocker(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown tier", []string{"-e", "DETSHARE_TIER=gold"}, []string{`DETSHARE_TIER="gold"`, "latency-critical"}},
		{"200% SMs", []string{"--label", "detshare.io/tier=burstable", "--label", "detshare.io/sms=200%"},
			[]string{`detshare.io/sms="200%"`}},
		{"memory over GPU", []string{"-e", "DETSHARE_TIER=burstable", "-e", "DETSHARE_MEMORY=100GiB"},
			[]string{`DETSHARE_MEMORY="100GiB"`, "more than GPU"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := "ds-docker-bad" + string(rune('a'+i))
			args := append([]string{"run", "--runtime=detshare", "--network", "none", "--name", name}, c.args...)
			out, err := e.docker(append(args, dockerImage, "true")...)
			if err == nil {
				t.Fatalf("docker run succeeded with a bad quota: %s", out)
			}
			t.Logf("refusal as the user sees it: %s", strings.TrimSpace(out))
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("error does not name %s:\n%s", w, out)
				}
			}
			id := dockerID(t, e, name)
			if st, _ := e.docker("inspect", "-f", "{{.State.Running}}", id); strings.TrimSpace(st) != "false" {
				t.Errorf("refused container running: %s", st)
			}
			e.assertNoLeak(t, id)
			if out, err := e.docker("rm", id); err != nil {
				t.Errorf("docker rm of the refused container: %v: %s", err, out)
			}
		})
	}
	t.Run("admission refused", func(t *testing.T) {
		t.Setenv("DETSHARE_SIMGPU", "1")
		if _, err := registrar.Register(context.Background(), e.runDir, tenant.Request{ID: "blocker",
			Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "latency-critical", "detshare.io/sms": "90%"}}.Resolve()}); err != nil {
			t.Fatalf("register blocker: %v", err)
		}
		defer tenant.Deregister(e.runDir, "blocker")
		out, err := e.docker("run", "--runtime=detshare", "--network", "none", "--name", "ds-docker-refused",
			"-e", "DETSHARE_TIER=burstable", "-e", "DETSHARE_SMS=50%", dockerImage, "true")
		if err == nil {
			t.Fatalf("admitted beside a 90%% latency-critical tenant: %s", out)
		}
		t.Logf("refusal as the user sees it: %s", strings.TrimSpace(out))
		if !strings.Contains(out, "admission refused") || !strings.Contains(out, "blocker") {
			t.Errorf("refusal does not say why:\n%s", out)
		}
		id := dockerID(t, e, "ds-docker-refused")
		e.assertNoLeak(t, id)
		e.docker("rm", id)
	})
}

// When containerd's runc shim of a Docker container dies, containerd cleans up with `runc delete` through the
// wrapper (the shim's BinaryName), which deregisters.
func TestDockerShimKilledDeregisters(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "-d", "--runtime=detshare", "--network", "none", "-e", "DETSHARE_TIER=best-effort",
		dockerImage, "sleep", "300")
	if err != nil {
		t.Fatalf("docker run: %v: %s", err, out)
	}
	id := strings.TrimSpace(out)
	defer e.docker("rm", "-f", id)
	e.waitRegistered(t, id)
	e.killShimAndWaitDeregistered(t, id, "containerd-shim-runc-v2")
	e.docker("rm", "-f", id)
	e.assertNoLeak(t, id)
}

// A terminal (`docker run -t`) goes through runc's --console-socket while the wrapper runs runc create as its child.
func TestDockerRunWithTerminal(t *testing.T) {
	e := needDocker(t)
	out, err := e.docker("run", "--rm", "-t", "--runtime=detshare", "--network", "none", "-e", "DETSHARE_TIER=best-effort",
		dockerImage, "sh", "-c", "test -t 1 && echo HAVE-TTY; simgpu-probe meminfo")
	if err != nil {
		t.Fatalf("docker run -t: %v: %s", err, out)
	}
	if !strings.Contains(out, "HAVE-TTY") || !strings.Contains(out, `"cmd":"meminfo"`) {
		t.Errorf("no terminal or no workload output:\n%s", out)
	}
}
