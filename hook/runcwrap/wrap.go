package runcwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/loglevel"
	"github.com/detshare/detshare/internal/table"
)

// EnvRunc names the real runc when no --detshare-runc is given.
const EnvRunc = "DETSHARE_RUNC"

// DefaultDockerRoot is Docker's default data-root.
const DefaultDockerRoot = "/var/lib/docker"

// Config is the wrapper's configuration after flags and environment.
type Config struct {
	Hook       hook.Config
	Runc       string
	DockerRoot string
}

// ConfigFor merges inv's own flags over the environment; reg is the binary's Registrar, devices its GPU device
// source for the hook's path (nil: containers get no device from DetShare).
func ConfigFor(inv Invocation, reg tenant.Registrar, devices func(hookPath string) cdi.Source) (Config, error) {
	c := Config{Hook: hook.ConfigFromEnv(reg), Runc: os.Getenv(EnvRunc), DockerRoot: DefaultDockerRoot}
	if v, ok := inv.Own[FlagRunDir]; ok {
		c.Hook.RunDir = v
	}
	if v, ok := inv.Own[FlagLib]; ok {
		c.Hook.LibPath = v
	}
	if v, ok := inv.Own[FlagHook]; ok {
		c.Hook.HookPath = v
	}
	if _, ok := inv.Own[FlagFailClosed]; ok {
		c.Hook.FailOpen = false
	}
	if v, ok := inv.Own[FlagDockerRoot]; ok {
		c.DockerRoot = v
	}
	if devices != nil {
		c.Hook.Devices = devices(c.Hook.HookPath)
	}
	if v, ok := inv.Own[FlagRunc]; ok {
		c.Runc = v
	}
	if c.Runc == "" {
		p, err := lookRunc()
		if err != nil {
			return c, err
		}
		c.Runc = p
	}
	return c, nil
}

// lookRunc finds runc on PATH, never this wrapper itself (installers may name it runc in a private directory).
func lookRunc() (string, error) {
	self, _ := os.Executable()
	selfSt, _ := os.Stat(self)
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "runc")
		st, err := os.Stat(p)
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			continue
		}
		if selfSt != nil && os.SameFile(st, selfSt) {
			continue
		}
		return p, nil
	}
	return "", fmt.Errorf("runc not found on PATH (%s): install runc or pass %s=/path/to/runc", os.Getenv("PATH"), FlagRunc)
}

// DockerLabels reads container id's labels from Docker's own record (<root>/containers/<id>/config.v2.json). Docker
// labels never reach the OCI spec; this is the only way `docker run --label detshare.io/tier=…` reaches DetShare.
// A missing record (not a Docker container) gives no labels.
func DockerLabels(dockerRoot, id string) (map[string]string, error) {
	if table.ValidateID(id) != nil {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(dockerRoot, "containers", id, "config.v2.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read Docker container record: %w", err)
	}
	var rec struct {
		Config struct {
			Labels map[string]string `json:"Labels"`
		} `json:"Config"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("parse Docker container record of %s: %w", id, err)
	}
	return rec.Config.Labels, nil
}

// Main runs the wrapper and returns the exit status; devices gives the placed GPU's edit, ver is the DetShare
// version (--version). Only create, delete, --help and --version return here; other verbs replace the process
// with runc.
func Main(args []string, reg tenant.Registrar, devices func(hookPath string) cdi.Source, ver string) int {
	logrus.SetOutput(os.Stderr)
	logrus.SetLevel(logrus.WarnLevel)
	inv, err := Parse(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "detshare-runtime:", err)
		return 2
	}
	exe, _ := os.Executable()
	if handled, version := ownHelpOrVersion(inv, os.Stdout, exe, ver); handled {
		if !version {
			return 0
		}
		// then runc's version, which Docker reads; without runc the wrapper's own line still answers.
		cfg, err := ConfigFor(inv, reg, devices)
		if err != nil {
			fmt.Fprintln(os.Stderr, "detshare-runtime:", err)
			return 0
		}
		return runChild(cfg.Runc, inv.RuncArgs)
	}
	if v, ok := inv.Own[FlagLogLevel]; ok {
		if err := loglevel.Set(FlagLogLevel, v); err != nil {
			fmt.Fprintln(os.Stderr, "detshare-runtime:", err)
			return 2
		}
	}
	cfg, err := ConfigFor(inv, reg, devices)
	if err != nil {
		fmt.Fprintln(os.Stderr, "detshare-runtime:", err)
		return 1
	}
	switch inv.Command {
	case "create", "run":
		return create(cfg, inv)
	case "delete":
		code := runChild(cfg.Runc, inv.RuncArgs)
		if code == 0 && inv.ID != "" {
			if err := hook.Poststop(cfg.Hook, inv.ID); err != nil {
				logrus.WithError(err).WithField("id", inv.ID).Warn("deregistration after delete failed")
			}
		}
		return code
	}
	argv := append([]string{cfg.Runc}, inv.RuncArgs...)
	err = syscall.Exec(cfg.Runc, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "detshare-runtime: exec %s: %v\n", cfg.Runc, err)
	return 1
}

func create(cfg Config, inv Invocation) int {
	bundle := inv.Bundle
	if bundle == "" {
		bundle, _ = os.Getwd()
	}
	labels, err := DockerLabels(cfg.DockerRoot, inv.ID)
	if err != nil {
		logrus.WithError(err).Warn("Docker labels not read")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Every `runc delete` of this container comes through the wrapper (containerd's runc shim runs its BinaryName,
	// also when cleaning up after a dead shim), which deregisters; no poststop hook is needed.
	p, err := hook.Prepare(ctx, cfg.Hook, hook.Request{ID: inv.ID, Bundle: bundle, Labels: labels, NoPoststopHook: true})
	if err != nil {
		reportError(inv, err)
		return 1
	}
	if p.FailedOpen != nil {
		// `runc create` runs with the container's stdio (containerd's runc shim hands it the container's pipes
		// when there is no terminal), so this line is the first of the container's stderr.
		fmt.Fprint(os.Stderr, hook.Notice(p.FailedOpen))
	}
	code := runChild(cfg.Runc, inv.RuncArgs)
	switch {
	case !p.Registered:
	case inv.Command == "run":
		// `runc run` returns when the container is gone (it deletes it itself), never through `runc delete`.
		if err := hook.Poststop(cfg.Hook, inv.ID); err != nil {
			logrus.WithError(err).WithField("id", inv.ID).Warn("deregistration after run failed")
		}
	case code != 0:
		hook.Rollback(cfg.Hook, inv.ID)
	}
	return code
}

// reportError puts err where the engine looks for runc's error: containerd's runc shim reads the last error of the
// --log file (JSON lines with --log-format json), and prints stderr otherwise.
func reportError(inv Invocation, err error) {
	msg := err.Error()
	fmt.Fprintln(os.Stderr, "detshare-runtime:", msg)
	if inv.Log == "" {
		return
	}
	f, ferr := os.OpenFile(inv.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if ferr != nil {
		return
	}
	defer f.Close()
	if inv.LogFormat == "json" {
		line, _ := json.Marshal(map[string]string{"level": "error", "msg": msg,
			"time": time.Now().UTC().Format(time.RFC3339Nano)})
		f.Write(append(line, '\n'))
		return
	}
	fmt.Fprintf(f, "level=error msg=%q\n", msg)
}

// runChild runs runc with the caller's stdio and returns its exit status.
func runChild(runc string, args []string) int {
	cmd := exec.Command(runc, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = inheritedFDs()
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "detshare-runtime: run %s: %v\n", runc, err)
		return 1
	}
	return 0
}

// inheritedFDs passes on file descriptors 3.. that the caller gave us (runc --preserve-fds and the
// console socket's fd forms rely on them), keeping their numbers.
func inheritedFDs() []*os.File {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	max := -1
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscan(e.Name(), &n); err == nil && n > max {
			max = n
		}
	}
	var files []*os.File
	for fd := 3; fd <= max; fd++ {
		flags, err := fcntlGetfd(fd)
		if err != nil || flags&syscall.FD_CLOEXEC != 0 {
			files = append(files, nil)
			continue
		}
		files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("fd%d", fd)))
	}
	for len(files) > 0 && files[len(files)-1] == nil {
		files = files[:len(files)-1]
	}
	return files
}

func fcntlGetfd(fd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
