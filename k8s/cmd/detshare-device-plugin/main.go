// Command detshare-device-plugin is DetShare's Kubernetes device plugin: it advertises detshare.io/gpu (SM groups)
// and detshare.io/gpu-memory (GiB) per node and turns kubelet's allocations into DetShare quota annotations (see
// package deviceplugin).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/k8s/deviceplugin"
	"github.com/detshare/detshare/k8s/internal/nodecli"
	"github.com/detshare/detshare/sched/gpuinfo"
)

func main() {
	app := &cli.App{
		Name:    "detshare-device-plugin",
		Version: version.Version,
		Usage:   "advertise DetShare GPU shares (detshare.io/gpu) and memory (detshare.io/gpu-memory) to kubelet",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "device-plugin-dir", Value: pluginapi.DevicePluginPath, EnvVars: []string{"DETSHARE_DEVICE_PLUGIN_DIR"},
				Usage: "kubelet's device-plugin directory (holds kubelet.sock)"},
			&cli.StringFlag{Name: "gpus", Value: "all", EnvVars: []string{"DETSHARE_DEVICE_PLUGIN_GPUS"},
				Usage: "the GPUs DetShare serves on this node: all, or a comma-separated list of indexes or UUIDs (the others are left to another plugin)"},
			&cli.StringFlag{Name: "ready-file", EnvVars: []string{"DETSHARE_DEVICE_PLUGIN_READY_FILE"},
				Usage: "a file kept present while every GPU served is DetShare's alone (no other device plugin registered with kubelet advertises it), for a readiness probe"},
		}, nodecli.Flags()...),
		Action: run,
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "detshare-device-plugin:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	// The GPU backend: NVML, or the simulated GPU (a test double) when the environment selects it.
	inv, err := nodecli.Inventory(c, simgpu.OrReal(gpuinfo.Discover))
	if err != nil {
		return err
	}
	if inv, err = inv.Select(c.String("gpus")); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	devices := nodecli.Devices(c, simgpu.Selected(os.Environ()), cdi.Simulated{})
	// A GPU whose MPS the scheduler records as failed is unhealthy until it recovers, one that reported a critical Xid
	// error for --xid-hold; one that another device plugin registered with kubelet advertises (NVIDIA's) is not
	// served, and the plugin is not ready, while it does.
	xid, err := nodecli.XidHealth(ctx, c, gpuinfo.WatchXid, inv)
	if err != nil {
		return err
	}
	dir := c.String("device-plugin-dir")
	health := deviceplugin.TableHealth(c.String("run-dir")).Or(xid).Or(deviceplugin.ClaimHealth(dir, inv))
	return deviceplugin.Run(ctx, dir, inv, devices, deviceplugin.Readiness(c.String("ready-file"), inv, health))
}
