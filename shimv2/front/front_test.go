package front

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/namespaces"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/sys/mountinfo"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/shimv2"
)

// The test binary doubles as the serving shim (envDaemon set): it records its arguments, environment and
// inherited fd 3, then serves connections on fd 3 until killed, as the real serving shim does.
const envDaemon = "FRONT_TEST_DAEMON"

func TestMain(m *testing.M) {
	if out := os.Getenv(envDaemon); out != "" {
		fakeDaemon(out)
		return
	}
	os.Exit(m.Run())
}

func fakeDaemon(out string) {
	l, err := net.FileListener(os.NewFile(3, "socket"))
	rec := fmt.Sprintf("pid=%d\nargs=%s\ngomaxprocs=%s\npgid-is-pid=%v\nlisten-err=%v\n", os.Getpid(),
		strings.Join(os.Args[1:], " "), os.Getenv("GOMAXPROCS"), syscall.Getpgrp() == os.Getpid(), err)
	if werr := os.WriteFile(out+".tmp", []byte(rec), 0o644); werr == nil {
		os.Rename(out+".tmp", out)
	}
	if err != nil {
		os.Exit(3)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(4)
		}
		c.Close()
	}
}

// startEnv is a Start configuration with a private socket directory and the test binary as the serving shim.
type startEnv struct {
	cfg    StartConfig
	record string
}

func newStartEnv(t *testing.T, annotations string) *startEnv {
	t.Helper()
	bundle := t.TempDir()
	spec := `{"ociVersion":"1.0.2","annotations":{` + annotations + `}}`
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Socket paths are limited to 107 bytes: a short private directory, not t.TempDir().
	sockDir, err := os.MkdirTemp("/tmp", "fs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	record := filepath.Join(t.TempDir(), "daemon")
	return &startEnv{record: record, cfg: StartConfig{Namespace: "default", ID: "c1",
		Address: "/run/containerd/containerd.sock", Serve: exe, Dir: bundle, SocketDir: sockDir,
		Env: append(os.Environ(), envDaemon+"="+record)}}
}

// daemonRecord waits for the serving shim's record; the shim is killed at the end of the test.
func (e *startEnv) daemonRecord(t *testing.T, pid int) map[string]string {
	t.Helper()
	if pid <= 0 {
		t.Fatalf("no serving shim pid (%d)", pid)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL); reap(pid) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(e.record)
		if err == nil {
			m := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				k, v, _ := strings.Cut(l, "=")
				m[k] = v
			}
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("the serving shim (pid %d) wrote no record: %v", pid, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func reap(pid int) {
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, 0, nil)
}

// children lists the test process's child processes, zombies included (/proc/self/task/*/children).
func children(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("list children: %v", err)
	}
	var out []string
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}

func TestSocketAddressIsContainerds(t *testing.T) {
	for _, c := range []struct{ addr, ns, id string }{
		{"/run/containerd/containerd.sock", "default", "c1"},
		{"/run/containerd/containerd.sock", "k8s.io", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"/tmp/dse2e-1/containerd.sock", "detshare-e2e", "x/../y"},
	} {
		want, err := shim.SocketAddress(namespaces.WithNamespace(context.Background(), c.ns), c.addr, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if got := SocketAddress(SocketDir, c.addr, c.ns, c.id); got != want {
			t.Errorf("SocketAddress(%q, %q, %q) = %s, containerd's %s", c.addr, c.ns, c.id, got, want)
		}
	}
	if RuntimeName != shimv2.RuntimeName {
		t.Errorf("front.RuntimeName %q, shimv2.RuntimeName %q", RuntimeName, shimv2.RuntimeName)
	}
}

func TestStartSpawnsTheServingShim(t *testing.T) {
	e := newStartEnv(t, `"other":"x"`)
	e.cfg.Debug = true
	st, err := Start(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.daemonRecord(t, st.Pid)
	if want := SocketAddress(e.cfg.SocketDir, e.cfg.Address, "default", "c1"); st.Address != want {
		t.Errorf("address %s, want the container's own %s", st.Address, want)
	}
	if rec["pid"] != strconv.Itoa(st.Pid) || rec["listen-err"] != "<nil>" {
		t.Fatalf("serving shim record %v (pid %d): fd 3 must be the listening socket", rec, st.Pid)
	}
	if want := "-namespace default -id c1 -address /run/containerd/containerd.sock -debug"; rec["args"] != want {
		t.Errorf("serving shim args %q, want %q", rec["args"], want)
	}
	if rec["gomaxprocs"] != "4" || rec["pgid-is-pid"] != "true" {
		t.Errorf("serving shim GOMAXPROCS %q, own process group %s", rec["gomaxprocs"], rec["pgid-is-pid"])
	}
	if b, err := os.ReadFile(filepath.Join(e.cfg.Dir, "address")); err != nil || string(b) != st.Address {
		t.Errorf("address file %q (%v), want %s", b, err, st.Address)
	}
	if !canConnect(st.Address) {
		t.Error("nothing accepts on the shim socket")
	}
	if fi, err := os.Stat(socketPath(st.Address)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v %v, want mode 0600", fi, err)
	}
	parent, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", os.Getppid()))
	child, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", st.Pid))
	if p, _ := strconv.Atoi(strings.TrimSpace(string(parent))); strings.TrimSpace(string(child)) != strconv.Itoa(min(p+1, 1000)) {
		t.Errorf("serving shim oom_score_adj %q, parent's %q: want parent's + 1", child, parent)
	}
}

// CRI puts every container of a pod into its sandbox's shim: the group annotations pick the socket, in
// containerd's order.
func TestStartGroupsByAnnotation(t *testing.T) {
	for _, c := range []struct{ ann, group string }{
		{`"io.kubernetes.cri.sandbox-id":"sb1"`, "sb1"},
		{`"io.kubernetes.cri.sandbox-id":"sb1","io.containerd.runc.v2.group":"g2"`, "g2"},
		{`"io.kubernetes.cri.container-type":"container"`, "c1"},
	} {
		e := newStartEnv(t, c.ann)
		// A live shim of the group: the container joins it, no process is started.
		want := SocketAddress(e.cfg.SocketDir, e.cfg.Address, "default", c.group)
		l, err := net.Listen("unix", socketPath(want))
		if err != nil {
			t.Fatal(err)
		}
		st, err := Start(e.cfg)
		l.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.ann, err)
		}
		if st.Address != want || st.Pid != 0 {
			t.Errorf("%s: address %s, pid %d; want the group %q's live shim %s and no new process", c.ann, st.Address, st.Pid, c.group, want)
		}
		if b, _ := os.ReadFile(filepath.Join(e.cfg.Dir, "address")); string(b) != want {
			t.Errorf("%s: address file %q, want %s", c.ann, b, want)
		}
		if _, err := os.Stat(e.record); err == nil {
			t.Errorf("%s: a serving shim was started although one serves the group", c.ann)
		}
	}
}

// A socket left by a shim that died is replaced, and a new serving shim listens on it.
func TestStartReplacesStaleSocket(t *testing.T) {
	e := newStartEnv(t, "")
	addr := SocketAddress(e.cfg.SocketDir, e.cfg.Address, "default", "c1")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: socketPath(addr)}); err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd) // the socket file stays, nothing listens
	if canConnect(addr) {
		t.Fatal("stale socket accepts")
	}
	st, err := Start(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.daemonRecord(t, st.Pid); rec["listen-err"] != "<nil>" || st.Address != addr || !canConnect(addr) {
		t.Errorf("stale socket not replaced by a served one: %v, %s", rec, st.Address)
	}
}

func TestStartWithoutServingShimNamesIt(t *testing.T) {
	dir := t.TempDir()
	front := filepath.Join(dir, BinaryName)
	os.WriteFile(front, []byte("#!/bin/sh\n"), 0o755)
	_, err := ServePath(front)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, ServeName)) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ServePath without %s: %v, want an error naming %s", ServeName, err, filepath.Join(dir, ServeName))
	}
	os.WriteFile(filepath.Join(dir, ServeName), []byte("x"), 0o644)
	if _, err := ServePath(front); err == nil || !strings.Contains(err.Error(), "not an executable") {
		t.Errorf("ServePath with a non-executable %s: %v", ServeName, err)
	}
	// A front reached through a symbolic link finds the serving shim beside the real file.
	os.Chmod(filepath.Join(dir, ServeName), 0o755)
	link := filepath.Join(t.TempDir(), BinaryName)
	os.Symlink(front, link)
	if p, err := ServePath(link); err != nil || p != filepath.Join(dir, ServeName) {
		t.Errorf("ServePath(%s) = %s, %v; want %s", link, p, err, filepath.Join(dir, ServeName))
	}
}

// A start that fails leaves no socket, no address file and no process behind.
func TestStartFailureLeavesNothing(t *testing.T) {
	e := newStartEnv(t, "")
	addr := SocketAddress(e.cfg.SocketDir, e.cfg.Address, "default", "c1")
	check := func(what string) {
		t.Helper()
		if _, err := os.Lstat(socketPath(addr)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: socket left behind (%v)", what, err)
		}
		if _, err := os.Lstat(filepath.Join(e.cfg.Dir, "address")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: address file left behind (%v)", what, err)
		}
	}
	// The serving shim cannot be started.
	bad := e.cfg
	bad.Serve = filepath.Join(t.TempDir(), ServeName)
	if _, err := Start(bad); err == nil || !strings.Contains(err.Error(), "start serving shim") {
		t.Errorf("missing serving shim: %v", err)
	}
	check("missing serving shim")

	// The serving shim started, then joining its cgroup failed: it is killed and reaped.
	e.cfg.Stdin = bytes.NewReader(runcOptionsAny(t, &options.Options{ShimCgroup: "not-absolute"}))
	before := children(t)
	_, err := Start(e.cfg)
	if err == nil || !strings.Contains(err.Error(), "not-absolute") {
		t.Fatalf("bad shim cgroup: %v", err)
	}
	check("bad shim cgroup")
	if after := children(t); len(after) != len(before) {
		t.Errorf("child processes %v after the failed start, %v before: the serving shim was left behind", after, before)
	}

	// No namespace: containerd's error.
	e.cfg.Namespace = ""
	if _, err := Start(e.cfg); !errors.Is(err, ErrNoNamespace) {
		t.Errorf("no namespace: %v", err)
	}
}

func runcOptionsAny(t *testing.T, v interface{}) []byte {
	t.Helper()
	a, err := typeurl.MarshalAny(v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(protobuf.FromAny(a))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The runtime options containerd sends to start, marshalled by containerd's own types.
func TestShimCgroupFromContainerdOptions(t *testing.T) {
	full := &options.Options{NoPivotRoot: true, ShimCgroup: "/podruntime/shim", IoUid: 7, BinaryName: "/usr/sbin/runc",
		Root: "/run/x", SystemdCgroup: true, CriuWorkPath: "/w", TaskApiVersion: 3}
	if cg, ok := ShimCgroup(runcOptionsAny(t, full)); !ok || cg != "/podruntime/shim" {
		t.Errorf("ShimCgroup = %q, %v; want /podruntime/shim", cg, ok)
	}
	if cg, ok := ShimCgroup(runcOptionsAny(t, &options.Options{Root: "/r"})); !ok || cg != "" {
		t.Errorf("no ShimCgroup: %q, %v", cg, ok)
	}
	// CRI's generic options for non-runc runtimes: containerd's runc manager reads no cgroup from them.
	if _, ok := ShimCgroup(runcOptionsAny(t, &runtimeoptions.Options{ConfigBody: []byte(`ShimCgroup = "/x"`)})); ok {
		t.Error("runtimeoptions.v1.Options taken for runc options")
	}
	if _, ok := ShimCgroup([]byte{0x0a, 0xff}); ok {
		t.Error("malformed protobuf accepted")
	}
}

// The delete action's stdout, decoded by containerd's own type.
func TestDeleteResponseDecodesAsContainerds(t *testing.T) {
	at := time.Unix(1795000000, 123456789)
	for _, c := range []struct{ pid, status int }{{4242, 137}, {-1, 137}, {0, 0}} {
		b := DeleteResponse(c.pid, c.status, at)
		var r taskAPI.DeleteResponse
		if err := proto.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if r.Pid != uint32(c.pid) || r.ExitStatus != uint32(c.status) || !protobuf.FromTimestamp(r.ExitedAt).Equal(at) {
			t.Errorf("decoded %v, want pid %d status %d at %v", &r, c.pid, c.status, at)
		}
		want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&taskAPI.DeleteResponse{Pid: uint32(c.pid),
			ExitStatus: uint32(c.status), ExitedAt: protobuf.ToTimestamp(at)})
		if !bytes.Equal(b, want) {
			t.Errorf("bytes %x, containerd's %x", b, want)
		}
	}
}

// Delete runs `runc delete --force` as containerd's manager does, reads the init pid and deregisters the
// container.
func TestDeleteRunsRuncAndDeregisters(t *testing.T) {
	t.Setenv("DETSHARE_SIMGPU", "1")
	runDir := filepath.Join(t.TempDir(), "run")
	if _, err := (&tenant.Registrar{DiscoverGPUs: simgpu.Discover}).Register(context.Background(), runDir,
		tenant.Request{ID: "c1", Quota: quota.Inputs{Annotations: map[string]string{"detshare.io/tier": "burstable", "detshare.io/sms": "16"}}.Resolve()}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := tenant.Lookup(runDir, "c1"); !ok {
		t.Fatal("c1 not registered")
	}
	parent := t.TempDir()
	bundle := filepath.Join(parent, "c1")
	os.Mkdir(bundle, 0o755)
	argsFile := filepath.Join(t.TempDir(), "runc-args")
	runc := filepath.Join(t.TempDir(), "fake-runc")
	os.WriteFile(runc, []byte("#!/bin/sh\necho \"$@\" > "+argsFile+"\necho \"NOTIFY=${NOTIFY_SOCKET-unset}\" >> "+argsFile+"\n"), 0o755)
	os.WriteFile(filepath.Join(bundle, "runtime"), []byte(runc), 0o600)
	os.WriteFile(filepath.Join(bundle, "options.json"), []byte(`{"binary_name":"`+runc+`","root":"/run/myroot","systemd_cgroup":true}`), 0o600)
	os.WriteFile(filepath.Join(bundle, "init.pid"), []byte("4242"), 0o644)
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")

	var logs bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logs)
	st, err := Delete(DeleteConfig{Namespace: "k8s.io", ID: "c1", Dir: bundle, RunDir: runDir, Log: logrus.NewEntry(log)})
	if err != nil {
		t.Fatal(err)
	}
	if st.Pid != 4242 || st.ExitStatus != 137 || time.Since(st.ExitedAt) > time.Minute {
		t.Errorf("stopped %+v, want pid 4242, status 137 (128+SIGKILL), now", st)
	}
	got, _ := os.ReadFile(argsFile)
	want := "--root /run/myroot/k8s.io --log " + filepath.Join(bundle, "log.json") + " --log-format json delete --force c1\nNOTIFY=unset\n"
	if string(got) != want {
		t.Errorf("runc ran with\n%s\nwant\n%s", got, want)
	}
	if _, ok, _ := tenant.Lookup(runDir, "c1"); ok {
		t.Error("c1 still registered after delete")
	}
	if s := logs.String(); strings.Contains(s, "level=warn") || !strings.Contains(s, "deregistered from DetShare at shim delete") || !strings.Contains(s, "id=c1") {
		t.Errorf("logs of a clean delete of a registered container: %s", s)
	}
	logs.Reset()

	// A bundle without options.json: containerd's runc root; a failing runc and no init.pid are warnings.
	os.Remove(filepath.Join(bundle, "options.json"))
	os.Remove(filepath.Join(bundle, "init.pid"))
	os.WriteFile(runc, []byte("#!/bin/sh\necho \"$@\" > "+argsFile+"\necho container gone >&2\nexit 1\n"), 0o755)
	st, err = Delete(DeleteConfig{Namespace: "default", ID: "c1", Dir: bundle, RunDir: runDir, Log: logrus.NewEntry(log)})
	if err != nil || st.Pid != -1 {
		t.Fatalf("delete with failing runc: %+v %v", st, err)
	}
	if got, _ := os.ReadFile(argsFile); !strings.HasPrefix(string(got), "--root /run/containerd/runc/default ") {
		t.Errorf("runc root without options.json: %s", got)
	}
	if s := logs.String(); !strings.Contains(s, "failed to remove runc container") || !strings.Contains(s, "container gone") ||
		!strings.Contains(s, "failed to read init pid file") || strings.Contains(s, "deregistered") {
		t.Errorf("warnings %s", s)
	}

	// No bundle: containerd's error (the runtime file).
	if _, err := Delete(DeleteConfig{Namespace: "default", ID: "gone", Dir: bundle, RunDir: runDir, Log: logrus.NewEntry(log)}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("delete of a missing bundle: %v", err)
	}
}

func TestParseFlagsAndHandles(t *testing.T) {
	f, err := ParseFlags([]string{"-namespace", "k8s.io", "-address", "/a.sock", "-publish-binary", "/bin/c", "-id", "x", "-debug", "start"})
	if err != nil || f.Namespace != "k8s.io" || f.Address != "/a.sock" || f.ID != "x" || !f.Debug || f.Action != "start" || !Handles(f) {
		t.Errorf("start flags %+v %v", f, err)
	}
	f, _ = ParseFlags([]string{"-namespace", "n", "-id", "x", "-bundle", "/b", "delete"})
	if !Handles(f) || f.Bundle != "/b" {
		t.Errorf("delete flags %+v", f)
	}
	for _, args := range [][]string{{"-namespace", "n", "-id", "x", "-address", "/a"}, {"-v"}, {"-namespace", "n", "-v", "delete"}} {
		if f, err := ParseFlags(args); err != nil || Handles(f) {
			t.Errorf("%q: handled by the front (%+v, %v); the serving shim must get it", args, f, err)
		}
	}
	if _, err := ParseFlags([]string{"-unknown"}); err == nil {
		t.Error("unknown flag accepted")
	}
}

// The shim cgroup of the runtime options: the serving shim is moved into it on every hierarchy that has it (cgroup
// v1 here, or the unified hierarchy), as containerd's runc manager does.
func TestJoinShimCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates a cgroup)")
	}
	cg := fmt.Sprintf("/detshare-front-test-%d", os.Getpid())
	var st syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/sys/fs/cgroup", cg) // the unified hierarchy
	controller := ""
	if st.Type != 0x63677270 { // CGROUP2_SUPER_MAGIC: else cgroup v1, the pids hierarchy
		dir, controller = filepath.Join("/sys/fs/cgroup/pids", cg), "pids"
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup here: %v", err)
	}
	defer os.Remove(dir)
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	if err := joinCgroup("", cg, child.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", child.Process.Pid))
	if !strings.Contains(string(b), ":"+controller+":"+cg+"\n") {
		t.Errorf("the process is not in %s (%s):\n%s", cg, controller, b)
	}
	if err := joinCgroup("", "/detshare-front-absent", child.Process.Pid); err == nil || !strings.Contains(err.Error(), "/detshare-front-absent") {
		t.Errorf("joining a cgroup that exists nowhere: %v", err)
	}
}

// delete unmounts what is left under the bundle's rootfs, deepest first, as containerd's mount.UnmountRecursive.
func TestDeleteUnmountsRootfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts)")
	}
	bundle := filepath.Join(t.TempDir(), "c1")
	rootfs := filepath.Join(bundle, "rootfs")
	sub := filepath.Join(rootfs, "with space")
	os.MkdirAll(rootfs, 0o755)
	if err := syscall.Mount("tmpfs", rootfs, "tmpfs", 0, ""); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer syscall.Unmount(rootfs, syscall.MNT_DETACH)
	os.Mkdir(sub, 0o755)
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(sub, syscall.MNT_DETACH)
	os.WriteFile(filepath.Join(bundle, "runtime"), []byte("true"), 0o600) // `true delete --force c1` succeeds
	var logs bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logs)
	if _, err := Delete(DeleteConfig{Namespace: "default", ID: "c1", Dir: bundle, RunDir: t.TempDir(), Log: logrus.NewEntry(log)}); err != nil {
		t.Fatal(err)
	}
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(rootfs))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		t.Errorf("%s still mounted after delete", m.Mountpoint)
	}
	if strings.Contains(logs.String(), "rootfs") {
		t.Errorf("unmount warnings: %s", logs.String())
	}
}
