package main

import (
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/doctor"
	"github.com/detshare/detshare/internal/kubeletdevices"
	"github.com/detshare/detshare/internal/layout"
	"github.com/detshare/detshare/internal/table"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the installed chain: runtime registered → binary → library → scheduler → GPU/MPS",
		Description: "Follows what a container start uses: each engine's detshare registration, the binary it names " +
			"(executable), the libdetshare.so that binary bind-mounts into containers (readable), the scheduler " +
			"(running, or startable on demand), then the NVIDIA driver, GPUs and MPS. Prints each requirement, what " +
			"was found and how to fix it. Exit status 0 means the host is ready, 1 means at least one check failed. " +
			"With --simulated-gpu the simulated GPU (a test double built by `make build`, installed in the library's simgpu/ directory) stands in for the NVIDIA " +
			"driver; every other check still applies. On a Kubernetes node it also reports the platform: NVIDIA's " +
			"container toolkit, the CDI specs, kubelet's version, the device plugins and DRA drivers registered with " +
			"kubelet, and fails when DetShare's device plugin and another advertise one GPU.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.BoolFlag{Name: "simulated-gpu", EnvVars: []string{"DETSHARE_SIMULATED_GPU"},
				Usage: "check the simulated GPU (test double) instead of the NVIDIA driver"},
			&cli.StringFlag{Name: "lib-dir", Value: layout.LibDir(), EnvVars: []string{"DETSHARE_LIB_DIR"},
				Usage: "directory holding simgpu/ (the simulated GPU, a test double): the library's directory, installed or build tree"},
			&cli.StringFlag{Name: "docker-config", Value: "/etc/docker/daemon.json", EnvVars: []string{"DETSHARE_DOCKER_CONFIG"},
				Usage: "Docker daemon.json to read the registration from"},
			&cli.StringFlag{Name: "containerd-config", Value: "/etc/containerd/config.toml", EnvVars: []string{"DETSHARE_CONTAINERD_CONFIG"},
				Usage: "containerd config.toml to read the registration from (its imports and conf.d/ too)"},
			&cli.StringFlag{Name: "kubelet-dir", Value: "/var/lib/kubelet", Usage: "kubelet's --root-dir: DRA drivers register in its plugins_registry/"},
			&cli.StringFlag{Name: "device-plugin-dir", Value: kubeletdevices.DefaultDevicePluginDir,
				Usage: "kubelet's device-plugin directory: its checkpoint says what each device plugin advertises"},
			&cli.StringSliceFlag{Name: "cdi-dir", Value: cli.NewStringSlice("/etc/cdi", "/var/run/cdi"), Usage: "where CDI specs are looked for (repeat)"},
		},
		Action: func(c *cli.Context) error {
			env := doctor.DefaultEnv(c.String("lib-dir"), c.Bool("simulated-gpu"))
			env.DockerConfig, env.ContainerdConfig = c.String("docker-config"), c.String("containerd-config")
			env.RunDir = table.RunDir(c.String("run-dir"))
			env.PluginsRegistry = filepath.Join(c.String("kubelet-dir"), "plugins_registry")
			env.DevicePluginDir, env.CDIDirs = c.String("device-plugin-dir"), c.StringSlice("cdi-dir")
			r := doctor.Run(env)
			if c.Bool("json") {
				if err := r.WriteJSON(c.App.Writer); err != nil {
					return err
				}
			} else {
				r.WriteText(c.App.Writer)
			}
			if !r.Ready {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}
