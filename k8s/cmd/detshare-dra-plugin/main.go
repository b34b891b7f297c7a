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
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	metadata "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
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
				Usage: "how GPUs are published: gpu (one shared device per GPU with consumable capacity sms and memory, and a " +
					"whole-GPU device that excludes it where partitionable devices are served; Kubernetes 1.36+), groups (one device " +
					"per SM group; Kubernetes 1.34), or auto (gpu where the apiserver serves consumable capacity, found by a dry-run create)"},
			&cli.StringFlag{Name: "device-taints", Value: "auto", EnvVars: []string{"DETSHARE_DEVICE_TAINTS"},
				Usage: "taint the devices of a GPU the scheduler reports unhealthy (" + dra.TaintKey + ", NoSchedule) and untaint them on recovery: " +
					"on, off, or auto (on where the apiserver serves device taints: DRADeviceTaints, on by default from Kubernetes 1.36)"},
			&cli.StringFlag{Name: "unhealthy-effect", Value: string(resourceapi.DeviceTaintEffectNoSchedule), EnvVars: []string{"DETSHARE_UNHEALTHY_EFFECT"},
				Usage: "the effect of the taint on an unhealthy GPU's devices: NoSchedule (no new claim gets them) or NoExecute (the " +
					"controller-manager also evicts the pods whose claims use them)"},
			&cli.BoolFlag{Name: "node-condition", Value: true, EnvVars: []string{"DETSHARE_NODE_CONDITION"},
				Usage: "keep the node condition " + string(dra.ConditionType) + " (the platform found: driver, MPS, toolkit, CDI, Kubernetes " +
					"version, DRA features served, GPUs published) on this node; needs patch on nodes/status"},
			&cli.BoolFlag{Name: "device-metadata", Value: true, EnvVars: []string{"DETSHARE_DEVICE_METADATA"},
				Usage: "write each prepared request's device metadata (KEP-5304: granted SMs, tier, memory limit, GPU) and mount it into " +
					"the container at /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.detshare.io-metadata.json"},
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
	drv := &dra.Driver{Node: node, Inventory: inv, CDIDir: c.String("cdi-dir"),
		Devices: nodecli.Devices(c, simgpu.Selected(os.Environ()), cdi.Simulated{})}
	helper, err := kubeletplugin.Start(ctx, drv, kubeletplugin.KubeClient(client), kubeletplugin.NodeName(node),
		kubeletplugin.DriverName(dra.DriverName),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(kubelet, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(dataDir), kubeletplugin.EnableDeviceMetadata(c.Bool("device-metadata")),
		kubeletplugin.MetadataVersions(metadata.SchemeGroupVersion), kubeletplugin.CDIDirectory(c.String("cdi-dir")))
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()
	served, err := dra.Probe(ctx, client, node)
	if err != nil {
		return err
	}
	opts, err := sliceOptions(c.String("devices"), c.String("device-taints"), served)
	if err != nil {
		return err
	}
	if opts.TaintEffect, err = taintEffect(c.String("unhealthy-effect")); err != nil {
		return err
	}
	opts.Node = node
	platform := dra.Platform{Served: served}
	if f, err := gpuinfo.Facts(); err != nil {
		logrus.WithError(err).Warn("NVML not reachable: the devices carry no architecture, compute capability or driver versions")
		platform.DriverErr = err.Error()
	} else {
		opts.Facts, platform.Driver = &f, &f
	}
	if v, err := client.Discovery().ServerVersion(); err == nil {
		platform.Kubernetes = v.GitVersion
	}
	xid, err := nodecli.XidHealth(ctx, c, gpuinfo.WatchXid, inv)
	if err != nil {
		return err
	}
	// NVIDIA's DRA driver publishing a GPU of this node (a ResourceSlice of gpu.nvidia.com with its UUID) keeps it
	// out of DetShare's slices until that slice goes.
	other, err := dra.OtherDriverHealth(ctx, client, node, inv)
	if err != nil {
		return err
	}
	health := deviceplugin.TableHealth(c.String("run-dir")).Or(xid).Or(other)
	var platformMu sync.Mutex // report (health changes) and the condition's heartbeat both read platform
	report := func(unhealthy map[int]string) {
		platformMu.Lock()
		defer platformMu.Unlock()
		platform.HostPlatform(c.String("host-root"), c.String("run-dir"))
		platform.Published, platform.Withheld = nil, nil
		for _, g := range inv.GPUs {
			if why := unhealthy[g.Index]; why != "" {
				platform.Withheld = append(platform.Withheld, fmt.Sprintf("GPU %d (%s): %s", g.Index, g.UUID, why))
			}
			if unhealthy[g.Index] != deviceplugin.ReasonClaimedElsewhere {
				platform.Published = append(platform.Published, g.Index)
			}
		}
		if err := platform.WritePlatformFile(dataDir); err != nil {
			logrus.WithError(err).Warn("platform file for detshare doctor not written")
		}
		if c.Bool("node-condition") {
			if err := dra.SetNodeCondition(ctx, client, node, platform.Condition(time.Now())); err != nil {
				logrus.WithError(err).Warn("node condition not set")
			}
		}
	}
	unhealthy := health()
	if err := helper.PublishResources(ctx, dra.Slices(inv, unhealthy, opts)); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	report(unhealthy)
	if c.Bool("node-condition") {
		go dra.KeepNodeCondition(ctx, client, node, dra.ConditionHeartbeat, func(now time.Time) corev1.NodeCondition {
			platformMu.Lock()
			defer platformMu.Unlock()
			return platform.Condition(now)
		})
		defer func() {
			stopped := platform.Condition(time.Now())
			stopped.Status, stopped.Reason = corev1.ConditionFalse, dra.ReasonStopped
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := dra.SetNodeCondition(sctx, client, node, stopped); err != nil {
				logrus.WithError(err).Warn("node condition not set")
			}
		}()
	}
	logrus.WithFields(logrus.Fields{"node": node, "gpus": len(inv.GPUs), "device_taints": opts.Taints, "taint_effect": opts.TaintEffect,
		"consumable_capacity": opts.Consumable, "partitionable": opts.Partitionable, "served": fmt.Sprintf("%+v", served)}).Info("DRA plugin serving")
	// The scheduler's view of each GPU, critical Xid errors and NVIDIA's DRA driver: a failed MPS server or a
	// critical Xid taints the GPU's devices (where taints are on; a failed MPS also clears their mpsAvailable
	// attribute) until it recovers; a GPU NVIDIA's driver publishes is not published.
	return health.Watch(ctx, time.Second, unhealthy, func(now, was map[int]string) error {
		logrus.WithFields(logrus.Fields{"unhealthy": now, "was": was}).Warn("GPU health changed: publishing device taints")
		if err := helper.PublishResources(ctx, dra.Slices(inv, now, opts)); err != nil {
			logrus.WithError(err).Warn("publish ResourceSlices")
			return deviceplugin.ErrRetry
		}
		report(now)
		return nil
	})
}

// taintEffect reads --unhealthy-effect.
func taintEffect(v string) (resourceapi.DeviceTaintEffect, error) {
	switch e := resourceapi.DeviceTaintEffect(v); e {
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
		return e, nil
	}
	return "", fmt.Errorf("--unhealthy-effect=%q: allowed values are %s, %s", v, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute)
}

// sliceOptions decides --devices and --device-taints from what the apiserver serves: --devices gpu (one shared
// device per GPU with consumable capacity, and the whole-GPU device where partitionable devices are served), groups
// (one device per SM group), or auto (gpu where consumable capacity is served, else groups); --device-taints on,
// off, or auto (on where device taints are served). Forcing what is not served is refused: the apiserver would drop
// the fields and the scheduler would see whole devices.
func sliceOptions(devices, taints string, served dra.Served) (dra.SliceOptions, error) {
	var o dra.SliceOptions
	switch devices {
	case "gpu":
		if !served.ConsumableCapacity {
			return o, errors.New("--devices=gpu: the apiserver does not serve consumable capacity (feature gate DRAConsumableCapacity, on by default from Kubernetes 1.36); use --devices=groups or auto")
		}
		o.Consumable = true
	case "groups":
	case "auto":
		o.Consumable = served.ConsumableCapacity
	default:
		return o, fmt.Errorf("--devices=%q: allowed values are gpu, groups, auto", devices)
	}
	o.Partitionable = o.Consumable && served.PartitionableDevices
	switch taints {
	case "true", "on":
		if !served.DeviceTaints {
			return o, errors.New("--device-taints=on: the apiserver does not serve device taints (feature gate DRADeviceTaints, on by default from Kubernetes 1.36); use off or auto")
		}
		o.Taints = true
	case "false", "off":
	case "auto":
		o.Taints = served.DeviceTaints
	default:
		return o, fmt.Errorf("--device-taints=%q: allowed values are auto, on, off", taints)
	}
	return o, nil
}
