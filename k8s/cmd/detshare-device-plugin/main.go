// Command detshare-device-plugin is DetShare's Kubernetes device plugin: it advertises detshare.io/gpu (SM groups)
// and detshare.io/gpu-memory (GiB) per node and turns kubelet's allocations into DetShare quota annotations (see
// package deviceplugin).
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
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/k8s/deviceplugin"
	"github.com/detshare/detshare/sched/table"
)

func main() {
	app := &cli.App{
		Name:  "detshare-device-plugin",
		Usage: "advertise DetShare GPU shares (detshare.io/gpu) and memory (detshare.io/gpu-memory) to kubelet",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "device-plugin-dir", Value: pluginapi.DevicePluginPath, EnvVars: []string{"DETSHARE_DEVICE_PLUGIN_DIR"},
				Usage: "kubelet's device-plugin directory (holds kubelet.sock)"},
			&cli.StringFlag{Name: "run-dir", Value: table.DefaultRunDir, EnvVars: []string{table.RunDirEnv},
				Usage: "DetShare's run directory: the scheduler's table gives the GPUs' published SM split"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"DETSHARE_LOG_LEVEL"}},
		},
		Action: run,
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "detshare-device-plugin:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	lvl, err := logrus.ParseLevel(c.String("log-level"))
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logrus.SetLevel(lvl)
	inv, err := deviceplugin.Discover(c.String("run-dir"))
	if err != nil {
		return err
	}
	if len(inv.GPUs) == 0 {
		return errors.New("no GPU found: nothing to advertise")
	}
	for _, g := range inv.GPUs {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID, "smGroups": len(g.Groups), "memGiB": g.MemGiB}).Info("advertising")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return deviceplugin.Run(ctx, c.String("device-plugin-dir"), inv)
}
