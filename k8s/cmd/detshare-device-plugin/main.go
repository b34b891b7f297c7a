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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	devices := nodecli.Devices(c, simgpu.Selected(os.Environ()), cdi.Simulated{})
	// A GPU whose MPS the scheduler records as failed is unhealthy until it recovers.
	return deviceplugin.Run(ctx, c.String("device-plugin-dir"), inv, devices, deviceplugin.TableHealth(c.String("run-dir")))
}
