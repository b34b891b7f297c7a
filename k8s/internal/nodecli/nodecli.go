// Package nodecli holds what DetShare's two kubelet plugins (device plugin, DRA plugin) share on their command line:
// the run-dir and log-level flags and finding the node's GPUs.
package nodecli

import (
	"context"
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/k8s/deviceplugin"
)

// Flags are --run-dir, --log-level, the host limits of a pod's weight and role, and --host-root.
func Flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "run-dir", Value: table.DefaultRunDir, EnvVars: []string{table.RunDirEnv},
			Usage: "DetShare's run directory: the scheduler's table gives the GPUs' published SM split"},
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"DETSHARE_LOG_LEVEL"},
			Usage: "panic, fatal, error, warning, info, debug or trace"},
		&cli.UintFlag{Name: "max-weight", Value: 1, EnvVars: []string{"DETSHARE_MAX_WEIGHT"},
			Usage: "the highest weight (1..10000) a pod's own detshare.io/weight or DETSHARE_WEIGHT may set; above it is capped"},
		&cli.StringFlag{Name: "allowed-roles", Value: "none", EnvVars: []string{"DETSHARE_ALLOWED_ROLES"},
			Usage: "the TPOT-First roles a pod may take (comma-separated: none, prefill, decode); any other is capped to none"},
		&cli.StringFlag{Name: "xid-ignored", Value: deviceplugin.DefaultIgnoredXids, EnvVars: []string{"DETSHARE_XID_IGNORED"},
			Usage: "critical Xid errors (NVML events) that do not make a GPU unhealthy, comma-separated, or none: by default the " +
				"application-caused ones NVIDIA's device plugin ignores"},
		&cli.DurationFlag{Name: "xid-hold", Value: 0, EnvVars: []string{"DETSHARE_XID_HOLD"},
			Usage: "how long a GPU stays unhealthy (reason xid-<n>) after its last critical Xid error, e.g. 10m; 0: until the plugin restarts"},
		&cli.StringFlag{Name: "host-root", Value: "/", EnvVars: []string{"DETSHARE_HOST_ROOT"},
			Usage: "where the node's / is mounted in this container (e.g. /host): the GPU's device nodes, driver " +
				"libraries and NVIDIA's CDI specs are looked up there and handed out by their host paths"},
	}
}

// Devices is the node's GPU device source (cgroupgpu/cdi) under --host-root; sim is the simulated GPU's (a test
// double), used when the environment selects it.
func Devices(c *cli.Context, simulated bool, sim cdi.Source) cdi.Source {
	if simulated {
		return sim
	}
	return cdi.Host{Root: c.String("host-root"), StripRoot: true}
}

// Inventory applies --log-level and finds the node's GPUs through --run-dir, or else with discover (the GPU backend
// the plugin's main chose); no GPU is an error.
func Inventory(c *cli.Context, discover func() ([]table.GPUInfo, error)) (deviceplugin.Inventory, error) {
	lvl, err := logrus.ParseLevel(c.String("log-level"))
	if err != nil {
		return deviceplugin.Inventory{}, fmt.Errorf("--log-level: %w", err)
	}
	logrus.SetLevel(lvl)
	limits, err := deviceplugin.ParseLimits(c.Uint("max-weight"), c.String("allowed-roles"))
	if err != nil {
		return deviceplugin.Inventory{}, err
	}
	inv, err := deviceplugin.Discover(c.String("run-dir"), discover)
	if err != nil {
		return inv, err
	}
	inv.Limits = limits
	if len(inv.GPUs) == 0 {
		return inv, errors.New("no GPU found: nothing to advertise")
	}
	for _, g := range inv.GPUs {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID, "smGroups": len(g.Groups), "memGiB": g.MemGiB}).Info("GPU")
	}
	return inv, nil
}

// XidHealth watches critical Xid errors with watch (the binary's NVML events) under --xid-ignored and --xid-hold
// until ctx ends (deviceplugin XidHealth): the GPUs that reported one are unhealthy, reason xid-<n>. Where it cannot
// watch it logs why and reports nothing.
func XidHealth(ctx context.Context, c *cli.Context, watch deviceplugin.XidWatch, inv deviceplugin.Inventory) (deviceplugin.Health, error) {
	ignored, err := deviceplugin.ParseIgnoredXids("--xid-ignored", c.String("xid-ignored"))
	if err != nil {
		return nil, err
	}
	hold := c.Duration("xid-hold")
	if hold < 0 {
		return nil, fmt.Errorf("--xid-hold=%s: allowed values are 0 (until the plugin restarts) or a positive duration such as 10m", hold)
	}
	gpus := make([]int, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		gpus = append(gpus, g.Index)
	}
	return (&deviceplugin.XidHealth{Ignored: ignored, Hold: hold, GPUs: gpus}).Watch(ctx, watch), nil
}
