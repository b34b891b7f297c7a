// Command detshare-dra-plugin is DetShare's DRA kubelet plugin (package dra): it publishes the node's GPUs as
// ResourceSlices of SM groups for the DeviceClass gpu.detshare.io and prepares claims into CDI specs carrying the
// tenant's quota.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/k8s/deviceplugin"
	"github.com/detshare/detshare/k8s/dra"
	"github.com/detshare/detshare/k8s/internal/nodecli"
	"github.com/detshare/detshare/sched/gpuinfo"
)

func main() {
	app := &cli.App{
		Name:    "detshare-dra-plugin",
		Version: version.Version,
		Usage:   "DetShare's DRA kubelet plugin (driver " + dra.DriverName + ")",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "this node's name (required)"},
			&cli.StringFlag{Name: "kubeconfig", EnvVars: []string{"KUBECONFIG"}, Usage: "kubeconfig (default: in-cluster)"},
			&cli.StringFlag{Name: "kubelet-dir", Value: "/var/lib/kubelet", Usage: "kubelet's root directory (plugins_registry and plugins/ live there)"},
			&cli.StringFlag{Name: "cdi-dir", Value: "/var/run/cdi", Usage: "where CDI specs go (the runtime's cdi_spec_dirs)"},
			&cli.StringFlag{Name: "devices", Value: "auto", EnvVars: []string{"DETSHARE_DRA_DEVICES"},
				Usage: "how GPUs are published: gpu (one shared device per GPU with consumable capacity sms and memory; Kubernetes 1.36+), " +
					"groups (one device per SM group; Kubernetes 1.34), or auto (gpu where the apiserver is 1.36 or later)"},
			&cli.BoolFlag{Name: "device-taints", EnvVars: []string{"DETSHARE_DEVICE_TAINTS"},
				Usage: "taint the devices of a GPU the scheduler reports unhealthy (" + dra.TaintKey + ", NoSchedule) and untaint them on recovery; " +
					"needs the DRADeviceTaints feature gate (alpha in Kubernetes 1.34: off, the apiserver drops the taints)"},
		}, nodecli.Flags()...),
		Action: run,
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "detshare-dra-plugin:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	node := c.String("node-name")
	if node == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	cfg, err := rest.InClusterConfig()
	if c.String("kubeconfig") != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", c.String("kubeconfig"))
	}
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The GPU backend: NVML, or the simulated GPU (a test double) when the environment selects it.
	inv, err := nodecli.Inventory(c, simgpu.OrReal(gpuinfo.Discover))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	kubelet := c.String("kubelet-dir")
	dataDir := filepath.Join(kubelet, "plugins", dra.DriverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("plugin directory: %w", err)
	}
	drv := &dra.Driver{Inventory: inv, CDIDir: c.String("cdi-dir"),
		Devices: nodecli.Devices(c, simgpu.Selected(os.Environ()), cdi.Simulated{})}
	helper, err := kubeletplugin.Start(ctx, drv, kubeletplugin.KubeClient(client), kubeletplugin.NodeName(node),
		kubeletplugin.DriverName(dra.DriverName),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(kubelet, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dataDir))
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()
	opts := dra.SliceOptions{Taints: c.Bool("device-taints")}
	if opts.Consumable, err = consumable(c.String("devices"), client); err != nil {
		return err
	}
	health := deviceplugin.TableHealth(c.String("run-dir"))
	unhealthy := health()
	if err := helper.PublishResources(ctx, dra.Slices(inv, unhealthy, opts)); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	logrus.WithFields(logrus.Fields{"node": node, "gpus": len(inv.GPUs), "device_taints": opts.Taints,
		"consumable_capacity": opts.Consumable}).Info("DRA plugin serving")
	if !opts.Taints {
		<-ctx.Done()
		return nil
	}
	// The scheduler's view of each GPU: a failed MPS server taints its devices until it runs again.
	return health.Watch(ctx, time.Second, unhealthy, func(now, was map[int]string) error {
		logrus.WithFields(logrus.Fields{"unhealthy": now, "was": was}).Warn("GPU health changed: publishing device taints")
		if err := helper.PublishResources(ctx, dra.Slices(inv, now, opts)); err != nil {
			logrus.WithError(err).Warn("publish ResourceSlices")
			return deviceplugin.ErrRetry
		}
		return nil
	})
}

// consumable decides --devices: gpu (consumable capacity), groups, or auto: gpu where the apiserver is Kubernetes 1.36
// or later, where consumable capacity is on by default.
func consumable(mode string, client kubernetes.Interface) (bool, error) {
	switch mode {
	case "gpu":
		return true, nil
	case "groups":
		return false, nil
	case "auto":
		v, err := client.Discovery().ServerVersion()
		if err != nil {
			return false, fmt.Errorf("--devices=auto: ask the apiserver its version: %w", err)
		}
		var major, minor int
		if _, err := fmt.Sscanf(v.Major+"."+strings.TrimRight(v.Minor, "+"), "%d.%d", &major, &minor); err != nil {
			return false, fmt.Errorf("--devices=auto: apiserver version %q.%q: %w", v.Major, v.Minor, err)
		}
		return major > 1 || major == 1 && minor >= 36, nil
	}
	return false, fmt.Errorf("--devices=%q: allowed values are gpu, groups, auto", mode)
}
