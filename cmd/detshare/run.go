package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/failopen"
	"github.com/detshare/detshare/internal/layout"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
	"github.com/detshare/detshare/sched/gpuinfo"
)

// exitSetupFailed is the exit status when DetShare itself refuses or fails before CMD runs (as `docker run`).
const exitSetupFailed = 125

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run a command as a DetShare tenant, without a container",
		ArgsUsage: "-- CMD [ARG...]",
		Description: `Registers a host tenant with the given GPU quota, runs CMD with libdetshare preloaded (LD_PRELOAD)
and its quota file named by DETSHARE_QUOTA_FILE, and deregisters when CMD exits or detshare is interrupted.

The exit status is CMD's (128+N when CMD is killed by signal N), or 125 when DetShare refuses the quota or fails
before CMD starts. Interrupts typed at the terminal (^C, ^\) reach CMD directly; INT, TERM, HUP, QUIT, USR1 and
USR2 sent to detshare are forwarded to CMD. If detshare itself is killed, the tenant is reaped as soon as the
scheduler or the next registration notices that its owner died. If DetShare cannot serve a tenant that asked for
it (any quota flag or DETSHARE_<FIELD> variable: no GPU, library missing, table full), detshare refuses (125) unless
the host set [tenants] fail_open = true in /etc/detshare/config.toml; then CMD runs without DetShare after a
"detshare: WARNING" line on stderr. A tenant that asked for nothing runs without DetShare after a warning
(--strict refuses instead).

Quota flags take precedence over DETSHARE_<FIELD> environment variables (see docs/table.md):
  --tier latency-critical|burstable|best-effort   (default best-effort)
  --sm N | P%          guaranteed SMs, rounded up to whole SM groups of the GPU's split
  --memory 8Gi | 50%   device memory limit (0 = unlimited)
  --weight 1..10000    share of the SMs nobody is guaranteed
  --role none|prefill|decode
  --gpu auto|INDEX|UUID
Weight and tier above the scheduler's tenants.max_weight / tenants.max_tier are scheduled at those ceilings unless
the host trusts the tenant (tenants.trusted in the scheduler's config.toml).

CMD sees only the tenant's GPU (CUDA_VISIBLE_DEVICES=<its UUID>) unless CUDA_VISIBLE_DEVICES is already set.

--join NAME runs CMD inside the existing tenant NAME (same quota, same memory budget) without registering.

Examples:
  detshare run --tier latency-critical --sm 50% --memory 20Gi --name infer -- python serve.py
  detshare run --tier best-effort -- python train.py
  detshare run --join infer -- python warmup.py`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tier", Usage: "SLO tier: latency-critical, burstable, best-effort"},
			&cli.StringFlag{Name: "sm", Aliases: []string{"sms"}, Usage: "guaranteed SMs: a count or a percent of the GPU (e.g. 32, 25%)"},
			&cli.StringFlag{Name: "memory", Usage: "device memory limit: bytes with K/M/G/T or Ki/Mi/Gi/Ti, or a percent"},
			&cli.StringFlag{Name: "weight", Usage: "weight for sharing what is not guaranteed (1..10000)"},
			&cli.StringFlag{Name: "role", Usage: "TPOT-First role: none, prefill, decode"},
			&cli.StringFlag{Name: "gpu", Usage: "GPU: auto, an index, or a UUID"},
			&cli.BoolFlag{Name: "lend", Usage: "latency-critical only: let idle guaranteed SM groups be lent"},
			&cli.BoolFlag{Name: "pinned", Usage: "latency-critical only: a static partition: run on exactly the guaranteed SMs (never expand); lower tiers keep the rest at full depth"},
			&cli.StringFlag{Name: "slo-p99", Usage: "latency-critical only: P99 latency target, e.g. 5ms (sizes the expansion from observed latency)"},
			&cli.StringFlag{Name: "name", Usage: "tenant name (default run-<pid>); letters, digits, _ . -"},
			&cli.StringFlag{Name: "join", Usage: "run CMD in the existing tenant `NAME` instead of registering one"},
			&cli.StringFlag{Name: "lib", EnvVars: []string{"DETSHARE_LIB"},
				Usage: "libdetshare.so to preload (default: ../lib/libdetshare.so next to the detshare binary)"},
			&cli.BoolFlag{Name: "strict", Usage: "refuse to run CMD when the table cannot be used (default: warn and run CMD without DetShare)"},
		},
		Action: func(c *cli.Context) error {
			code, err := runTenant(c)
			if err != nil {
				return cli.Exit(fmt.Sprintf("detshare run: %v", err), exitSetupFailed)
			}
			if code != 0 {
				os.Exit(code) // CMD's status, without an error message of ours
			}
			return nil
		},
	}
}

// runTenant registers (or joins), runs CMD, deregisters, and returns CMD's exit status. An error means CMD did not run.
func runTenant(c *cli.Context) (int, error) {
	args := c.Args().Slice()
	if len(args) == 0 {
		return 0, errors.New("missing CMD: usage is `detshare run [flags] -- CMD [ARG...]`")
	}
	runDir := table.RunDir(c.String("run-dir"))
	if c.IsSet("join") {
		for _, f := range []string{"tier", "sm", "memory", "weight", "role", "gpu", "lend", "pinned", "slo-p99", "name"} {
			if c.IsSet(f) {
				return 0, fmt.Errorf("--join %s: --%s cannot be combined with --join (the tenant's quota is fixed at registration)", c.String("join"), f)
			}
		}
	}

	// Signals are caught from here on so that an interrupt during registration still deregisters.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	env := os.Environ()
	lib := libPath(c.String("lib"))
	id := ""
	registered := false
	switch {
	case c.IsSet("join"):
		id = c.String("join")
		res, ok, err := tenant.Lookup(runDir, id)
		if err != nil {
			return 0, fmt.Errorf("--join %s: %w", id, err)
		}
		if !ok {
			return 0, fmt.Errorf("--join %s: no such tenant in %s (start it with `detshare run --name %s -- …`)", id, runDir, id)
		}
		env = tenantEnv(env, runDir, id, res.QuotaFile)
		env = withVisibleGPU(env, res.GPU)
	default:
		id = c.String("name")
		if id == "" {
			id = fmt.Sprintf("run-%d", os.Getpid())
		}
		flags := map[quota.Field]string{}
		for flag, f := range map[string]quota.Field{"tier": quota.FieldTier, "sm": quota.FieldSMs,
			"memory": quota.FieldMemory, "weight": quota.FieldWeight, "role": quota.FieldRole, "gpu": quota.FieldGPU,
			"slo-p99": quota.FieldSLOP99} {
			if c.IsSet(flag) {
				flags[f] = c.String(flag)
			}
		}
		if c.IsSet("lend") {
			flags[quota.FieldLend] = fmt.Sprint(c.Bool("lend"))
		}
		if c.IsSet("pinned") {
			flags[quota.FieldPinned] = fmt.Sprint(c.Bool("pinned"))
		}
		in := quota.Inputs{Flags: flags, Env: env}.Resolve()
		asked := in.Asked
		res, err := registerHost(runDir, lib, tenant.Request{ID: id, Quota: in, OwnerPID: os.Getpid()})
		switch {
		case err == nil:
			registered = true
			env = tenantEnv(env, runDir, id, res.QuotaFile)
			env = withVisibleGPU(env, res.GPU)
			logrus.WithFields(logrus.Fields{"id": id, "slot": res.Registration.Slot, "gpu": res.Placement.GPU,
				"sms": res.Placement.SMs, "memory": res.Placement.MemLimit}).Info("registered host tenant")
		case isRefusal(err) || c.Bool("strict"):
			return 0, err
		case asked && !hook.FailOpenPolicy():
			return 0, hook.RefusalError(err)
		case asked:
			// Fail-open configured by the host: say so where the user looks, and count it.
			fmt.Fprint(os.Stderr, hook.Notice(err))
			_ = failopen.Record(runDir, id, err)
		default:
			// Nothing was asked for: DetShare being unusable here must not stop the user's GPU work.
			logrus.WithError(err).Warn("DetShare unavailable; running CMD without it (use --strict to refuse)")
		}
	}
	if registered {
		defer func() {
			if err := tenant.Deregister(runDir, id); err != nil {
				logrus.WithError(err).WithField("id", id).Warn("deregister")
			}
		}()
	}
	if registered || c.IsSet("join") {
		env = withPreload(env, lib)
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr, cmd.Env = os.Stdin, os.Stdout, os.Stderr, env
	if registered || c.IsSet("join") {
		// The client page is root's (its directory too): a CMD that drops privileges before it uses the GPU
		// (setpriv, gosu, su) takes it from this inherited carrier instead, never from a descriptor of the page
		// itself, which another process of its new user could reopen through /proc before the library's
		// constructor makes the program non-dumpable (docs/threat-model.md "Privilege drops").
		if f, err := table.NewPageCarrier(table.NewPaths(runDir).ClientPage(id)); err == nil {
			defer f.Close()
			cmd.ExtraFiles = []*os.File{f}
			cmd.Env = setEnv(cmd.Env, table.PageCarrierEnv, "3") // ExtraFiles[0] is descriptor 3
		} else {
			logrus.WithError(err).Warn("a CMD that drops privileges before it uses the GPU will be refused")
		}
	}
	select {
	case s := <-sigs: // interrupted while registering: CMD never starts
		return 128 + int(s.(syscall.Signal)), nil
	default:
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", args[0], err)
	}
	done := make(chan struct{})
	foreground := inForeground()
	go func() {
		for {
			select {
			case s := <-sigs:
				// A terminal sends ^C and ^\ to the whole foreground process group, CMD included: forwarding them
				// too would deliver them twice.
				if foreground && (s == syscall.SIGINT || s == syscall.SIGQUIT) {
					continue
				}
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	return exitStatus(cmd, err), nil
}

// inForeground tells whether detshare runs in the foreground process group of the terminal on stdin.
func inForeground() bool {
	pgrp, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}

// isRefusal tells whether err is the user's to fix (bad quota, no room, name taken) rather than DetShare being
// unusable on this host.
func isRefusal(err error) bool {
	var fe *quota.FieldError
	var ae *quota.AdmissionError
	return errors.As(err, &fe) || errors.As(err, &ae) || errors.Is(err, table.ErrExists) ||
		errors.Is(err, table.ErrInvalidID)
}

func exitStatus(cmd *exec.Cmd, err error) int {
	if cmd.ProcessState == nil {
		return exitSetupFailed
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if err != nil && cmd.ProcessState.ExitCode() < 0 {
		return exitSetupFailed
	}
	return cmd.ProcessState.ExitCode()
}

func tenantEnv(env []string, runDir, id, quotaFile string) []string {
	env = setEnv(env, "DETSHARE_QUOTA_FILE", quotaFile)
	env = setEnv(env, table.RunDirEnv, runDir)
	return setEnv(env, "DETSHARE_TENANT", id)
}

// withVisibleGPU points CUDA at the tenant's GPU (CUDA_VISIBLE_DEVICES=<UUID>) unless the user chose devices
// already: the quota is accounted on that GPU, so CMD must run there. Simulated GPUs (SIM-…) are left alone.
func withVisibleGPU(env []string, gpu table.GPUState) []string {
	if !strings.HasPrefix(gpu.UUID, "GPU-") {
		return env
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
			return env
		}
	}
	return setEnv(env, "CUDA_VISIBLE_DEVICES", gpu.UUID)
}

// libPath picks libdetshare.so: --lib / DETSHARE_LIB, else the layout's (internal/layout).
func libPath(flag string) string {
	if flag != "" {
		return flag
	}
	return layout.LibPath()
}

// registerHost registers a host tenant after checking what DetShare needs and what a registration would leave on
// the host: a library CMD can preload and, when no scheduler runs yet, a GPU. Without those nothing is started and
// no run directory is created (a root `detshare sched` and /run/detshare would outlive the refusal).
func registerHost(runDir, lib string, req tenant.Request) (tenant.Result, error) {
	reg := hostRegistrar()
	if f, err := os.Open(lib); err != nil {
		return tenant.Result{}, fmt.Errorf("libdetshare.so not readable (install it with `make install` or the .deb, or pass --lib): %w", err)
	} else {
		f.Close()
	}
	if !ensure.LeaderRunning(runDir) && !tableHasGPUs(runDir) {
		if _, err := reg.DiscoverGPUs(); err != nil {
			return tenant.Result{}, fmt.Errorf("no GPU to share on this host (the scheduler was not started): %w", err)
		}
	}
	return reg.Register(context.Background(), runDir, req)
}

// hostRegistrar is how `detshare run` registers in this process (cmd/internal/wiring.Host with NVML discovery).
func hostRegistrar() tenant.Registrar { return wiring.Host(gpuinfo.Discover) }

// tableHasGPUs tells whether runDir already holds a table that records GPUs (read-only look).
func tableHasGPUs(runDir string) bool {
	t, err := table.Open(runDir)
	if err != nil {
		return false
	}
	defer t.Close()
	return len(t.GPUs()) > 0
}

// withPreload prepends lib to LD_PRELOAD. A missing library is reported and not preloaded (the loader would print
// an error in every child process).
func withPreload(env []string, lib string) []string {
	if _, err := os.Stat(lib); err != nil {
		logrus.WithField("lib", lib).Warn("libdetshare.so not found; CMD runs without interception (set --lib or DETSHARE_LIB)")
		return env
	}
	cur := getEnv(env, "LD_PRELOAD")
	for _, p := range strings.FieldsFunc(cur, func(r rune) bool { return r == ':' || r == ' ' }) {
		if p == lib {
			return env
		}
	}
	if cur != "" {
		lib = lib + ":" + cur
	}
	return setEnv(env, "LD_PRELOAD", lib)
}

func getEnv(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

func setEnv(env []string, key, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k == key {
			continue
		}
		out = append(out, kv)
	}
	return append(out, key+"="+value)
}
