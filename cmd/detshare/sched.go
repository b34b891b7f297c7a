package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/sched/daemon"
	"github.com/detshare/detshare/sched/gpuinfo"
)

func schedCommand() *cli.Command {
	return &cli.Command{
		Name:  "sched",
		Usage: "run the host scheduler (started on demand by the runtime; run it yourself or via systemd if you prefer)",
		Description: "Leads the host (flock on <run-dir>/sched.lock; a second instance exits at once with status 0), " +
			"partitions each GPU's SM groups between tenants by tier, weight and role, runs one MPS control daemon " +
			"per GPU, reaps dead processes and tenants, and exports Prometheus metrics. SIGHUP reloads the " +
			"configuration; SIGINT/SIGTERM stop it, leaving every tenant on its last grant.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Value: config.DefaultPath, EnvVars: []string{"DETSHARE_CONFIG"},
				Usage: "configuration file (a missing file means the defaults)"},
			&cli.StringFlag{Name: "metrics-listen", Usage: "override metrics.listen (host:port, empty = config)"},
			&cli.BoolFlag{Name: "no-mps", Usage: "do not start MPS: temporal quanta only"},
			&cli.BoolFlag{Name: "stop-mps-on-exit",
				Usage: "at a clean exit, quit the MPS control daemons of GPUs with no tenant left (default: they keep running)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := config.Load(c.String("config"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			if v := c.String("metrics-listen"); v != "" {
				cfg.Metrics.Listen = v
			}
			if c.Bool("no-mps") {
				cfg.MPS.Enable = false
			}
			ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			runDir := c.String("run-dir")
			opts := daemon.Options{RunDir: runDir, Config: cfg, Discover: wiring.GPUs(gpuinfo.Discover),
				SimulatedGPU: wiring.SimulatedGPU(), StopMPSOnExit: c.Bool("stop-mps-on-exit")}
			// NVML's per-process memory: the driver's, or the simulated GPU's double (libnvidia-ml.so.1 found
			// through LD_LIBRARY_PATH) when the simulated GPU is selected.
			opts.ProcessMemory = gpuinfo.ProcessMemorySampler()
			if !opts.SimulatedGPU {
				opts.Board = gpuinfo.BoardSampler()
				opts.ComputeModes = gpuinfo.NVMLComputeModes{} // used only with mps.exclusive = true
			} else {
				opts.ComputeModes = simgpu.ComputeModes{State: simgpu.StatePath(os.Environ())}
			}
			err = daemon.Main(ctx, opts, c.String("config"), hup)
			if errors.Is(err, daemon.ErrNotLeader) {
				logrus.WithField("run_dir", runDir).Info("another scheduler leads; exiting")
				return nil
			}
			if err != nil {
				return cli.Exit(fmt.Sprintf("detshare sched: %v", err), 1)
			}
			return nil
		},
	}
}
