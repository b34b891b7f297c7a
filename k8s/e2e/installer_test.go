package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/detshare/detshare/integration/testenv"
)

// restart stops the cluster's daemon name and starts it again as it was started, appending to its log (what a
// node's systemd does on `systemctl restart`); containers keep running (their shims are not its children).
func (c *cluster) restart(name string) error {
	i := -1
	for j, n := range c.names {
		if n == name {
			i = j
		}
	}
	if i < 0 {
		return fmt.Errorf("no daemon %s", name)
	}
	testenv.StopDaemon(c.daemons[i])
	logPath := filepath.Join(c.dir, name+".log")
	var before int64
	if st, err := os.Stat(logPath); err == nil {
		before = st.Size()
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	old := c.launched[i]
	cmd := exec.Command(old.Path, old.Args[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = old.Env, logf, logf
	d, err := testenv.StartDaemon(cmd)
	if err != nil {
		return fmt.Errorf("restart %s: %w", name, err)
	}
	c.daemons[i], c.launched[i] = d, cmd
	switch name {
	case "containerd":
		return c.waitFor(name, d, 60*time.Second, func() error { _, err := c.ctr("version"); return err })
	case "kubelet":
		// The node object keeps its allocatable across the restart, so the scheduler may bind a pod before the
		// device plugin has registered with the new kubelet, which then refuses it (no healthy devices): wait until
		// this kubelet has the plugin's devices for both resources.
		return c.waitFor(name, d, 60*time.Second, func() error {
			data, err := os.ReadFile(logPath)
			if err != nil {
				return err
			}
			since := string(data[min(before, int64(len(data))):])
			for _, res := range []string{"detshare.io/gpu", "detshare.io/gpu-memory"} {
				if !strings.Contains(since, `"Processed device updates for resource" resourceName="`+res+`"`) {
					return fmt.Errorf("the restarted kubelet has no devices of %s yet", res)
				}
			}
			return nil
		})
	}
	return nil
}

// restartNode restarts containerd, then kubelet, and waits for the node to be Ready with DetShare's resources again
// (the device plugin re-registers with the new kubelet).
func (c *cluster) restartNode(t *testing.T) {
	t.Helper()
	for _, n := range []string{"containerd", "kubelet"} {
		if err := c.restart(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.waitNodeReady(); err != nil {
		t.Fatalf("after restarting containerd and kubelet: %v", err)
	}
}

// withoutHandler is a containerd configuration the cluster's own with its inline detshare handler removed: the node
// before DetShare.
func withoutHandler(t *testing.T, cfg string) string {
	t.Helper()
	lines := strings.Split(cfg, "\n")
	var out []string
	skip := false
	for _, l := range lines {
		tl := strings.TrimSpace(l)
		if strings.HasPrefix(tl, "[") {
			skip = strings.HasSuffix(tl, ".containerd.runtimes.detshare]")
		}
		if !skip {
			out = append(out, l)
		}
	}
	s := strings.Join(out, "\n")
	if s == cfg || strings.Contains(s, "detshare.v1") {
		t.Fatalf("could not remove the detshare handler from the cluster's containerd config:\n%s", cfg)
	}
	return s
}

// The chart's installer DaemonSet (the installer image built here, imported into the cluster's containerd) installs
// the runtime handler into the real kubelet's containerd configuration: after containerd and kubelet restart, a pod
// with runtimeClassName detshare runs through the shim it copied onto the node; `helm uninstall` restores the
// configuration byte for byte and removes the handler, so after the next restart such a pod is refused. The cluster's
// own configuration (inline handler) is put back at the end.
func TestInstallerDaemonSetOnTheNodesContainerd(t *testing.T) {
	c := need(t)
	const rel = "ds-node"
	cfgPath := filepath.Join(c.dir, "containerd.toml")
	orig, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	bare := withoutHandler(t, string(orig))
	if err := os.WriteFile(cfgPath, []byte(bare), 0o644); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(c.dir, "node-install")
	binDir, libDir, drop := filepath.Join(node, "bin"), filepath.Join(node, "lib"), filepath.Join(c.dir, "conf.d", "detshare.toml")
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			c.helm("uninstall", rel, "--namespace", chartNS, "--wait", "--timeout", "2m")
		}
		os.WriteFile(cfgPath, orig, 0o644)
		os.Remove(drop)
		for _, n := range []string{"containerd", "kubelet"} {
			if err := c.restart(n); err != nil {
				t.Errorf("restore the cluster: %v", err)
			}
		}
		if err := c.waitNodeReady(); err != nil {
			t.Errorf("restore the cluster: %v", err)
		}
	})

	args := append([]string{"install", rel, c.chartDir(), "--namespace", chartNS}, c.commonValues()...)
	args = append(args, "--set", "installer.enabled=true", "--set", "installer.restartContainerd=false",
		"--set", "hostBinDir="+binDir, "--set", "hostLibDir="+libDir, "--set", "containerdConfig="+cfgPath,
		"--set", "containerdDropIn="+drop, "--set", "nodeDaemon.enabled=false", "--set", "devicePlugin.enabled=false",
		"--set", "runtimeClass.enabled=false")
	if _, err := c.helm(args...); err != nil {
		t.Fatal(err)
	}
	c.waitInstallerRunning(t, rel)
	shim := filepath.Join(binDir, "containerd-shim-detshare-v1")
	if d, err := os.ReadFile(drop); err != nil || !strings.Contains(string(d), fmt.Sprintf("runtime_path = %q", shim)) {
		t.Fatalf("installer: drop-in %s: %v:\n%s", drop, err, d)
	}
	if d, _ := os.ReadFile(cfgPath); !strings.Contains(string(d), drop) {
		t.Fatalf("installer: %s does not import the drop-in:\n%s", cfgPath, d)
	}

	c.restartNode(t) // containerd reads the handler; kubelet re-registers the device plugin
	pod := sharePod("installed-handler", 1, 1)
	id, done := c.runTenant(t, pod)
	if tn, ok := tenantOf(c.status(t), id); !ok || tn.Pod != pod.Name {
		t.Errorf("the pod run through the installed handler is not a tenant (%+v, %v)", tn, ok)
	}
	// The front (the handler) spawns the serving shim from its own directory and exits: a serving shim running from
	// the installer's directory is the installed handler at work.
	if serving := shim + "-serve"; len(processesOf(serving)) == 0 {
		t.Errorf("no process runs the serving shim the installer copied (%s): the handler is not the installed one", serving)
	}
	done()

	if _, err := c.helm("uninstall", rel, "--namespace", chartNS, "--cascade", "foreground", "--wait", "--timeout", "2m"); err != nil {
		t.Fatal(err)
	}
	uninstalled = true
	if after, err := os.ReadFile(cfgPath); err != nil || string(after) != bare {
		t.Errorf("after helm uninstall %s is\n%s\nwant it byte for byte as before the install\n%s", cfgPath, after, bare)
	}
	if left, _ := filepath.Glob(cfgPath + "?*"); len(left) != 0 {
		t.Errorf("after helm uninstall: %v left beside the config", left)
	}
	if _, err := os.Stat(drop); !os.IsNotExist(err) {
		t.Errorf("after helm uninstall the drop-in %s is still there (%v)", drop, err)
	}
	if ents, _ := os.ReadDir(binDir); len(ents) != 0 {
		t.Errorf("after helm uninstall %s holds %v", binDir, ents)
	}

	if err := c.restart("containerd"); err != nil {
		t.Fatal(err)
	}
	refused := sharePod("handler-gone", 1, 1)
	evs := c.createAwaitingEvent(t, refused, "FailedCreatePodSandBox", 60*time.Second)
	if !strings.Contains(evs, "FailedCreatePodSandBox") || !strings.Contains(evs, "detshare") {
		t.Errorf("after uninstall and a containerd restart, a detshare pod: want FailedCreatePodSandBox naming the handler; events:\n%s", evs)
	}
}

// processesOf lists the PIDs whose executable is path.
func processesOf(path string) []string {
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path {
			pids = append(pids, e.Name())
		}
	}
	return pids
}
