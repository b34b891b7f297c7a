// Command detshare-hook is DetShare's OCI hook. Unlike the shim and the wrapper it does not start the scheduler on
// demand (sched/ensure): at createContainer it runs inside the container's PID namespace, where a scheduler would
// neither see host PIDs nor outlive the container; hooks.d hosts run the scheduler as a service. Registered through
// a hooks directory (podman --hooks-dir, CRI-O; configs/hooks.d) it runs at createContainer, where it registers the
// container and bind-mounts DetShare's files itself, and at poststop, where it deregisters it: the poststop command
// is for that standalone path, because the shim and the runc wrapper deregister on delete themselves and leave it
// out of the specs they edit (but for the case hook.Request.NoPoststopHook describes). They put it into a spec as
// the GPU edit's loader-cache hook (ldcache). Logic lives in package hook.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/internal/loglevel"
)

func main() {
	if err := newApp().Run(os.Args); err != nil {
		// The runtime puts the hook's stderr in its own error message, which is what the user sees.
		fmt.Fprintln(os.Stderr, "detshare-hook:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	var cfg hook.Config
	state := func(c *cli.Context) (hook.State, error) { return hook.ReadState(c.App.Reader) }
	return &cli.App{
		Name:    "detshare-hook",
		Version: version.Version,
		Usage:   "OCI hook that attaches containers to DetShare (reads the OCI state on stdin)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "run-dir", EnvVars: []string{"DETSHARE_RUN_DIR"}, Value: "/run/detshare",
				Usage: "DetShare run directory"},
			&cli.StringFlag{Name: "lib", Usage: "host path of libdetshare.so (default: $DETSHARE_LIB, else " +
				"../lib/detshare/libdetshare.so next to this binary, else ../lib/libdetshare.so)"},
			&cli.BoolFlag{Name: "fail-closed", EnvVars: []string{hook.EnvFailClosed},
				Usage: "refuse the container when DetShare itself fails even if [tenants] fail_open is set (the default refuses)"},
			&cli.StringFlag{Name: "log-level", Value: "warning", EnvVars: []string{"DETSHARE_LOG_LEVEL"},
				Usage: loglevel.Allowed},
		},
		Before: func(c *cli.Context) error {
			if err := loglevel.Set("--log-level", c.String("log-level")); err != nil {
				return err
			}
			exe, _ := os.Executable()
			cfg = hook.ConfigFromEnv(wiring.Hook())
			cfg.RunDir, cfg.HookPath = c.String("run-dir"), exe
			if c.IsSet("lib") {
				cfg.LibPath = c.String("lib")
			}
			if c.Bool("fail-closed") {
				cfg.FailOpen = false
			}
			return nil
		},
		Commands: []*cli.Command{
			{
				Name:    "createContainer",
				Aliases: []string{"prestart"},
				Usage:   "register the container and bind-mount DetShare's files (standalone use through hooks.d)",
				Action: func(c *cli.Context) error {
					st, err := state(c)
					if err != nil {
						return err
					}
					ctx, cancel := context.WithTimeout(c.Context, 20*time.Second)
					defer cancel()
					return hook.CreateContainer(ctx, cfg, st)
				},
			},
			{
				Name: "ldcache",
				Usage: "add the GPU driver's library folders to the container's loader cache (createContainer hook of " +
					"the GPU edit; runs the host's ldconfig on the container's root, needs nothing from the image)",
				Flags: []cli.Flag{&cli.StringSliceFlag{Name: "folder", Usage: "container path of a library folder (repeatable)"}},
				Action: func(c *cli.Context) error {
					st, err := state(c)
					if err != nil {
						return err
					}
					rootfs, err := hook.RootFS(st)
					if err == nil {
						err = cdi.UpdateLDCache(rootfs, c.StringSlice("folder"))
					}
					if err != nil {
						// The libraries are also mounted at their sonames: most images load them without the cache,
						// so a failure here must not stop the container.
						fmt.Fprintln(c.App.ErrWriter, "detshare-hook: WARNING: GPU libraries not added to the loader cache:", err)
					}
					return nil
				},
			},
			{
				Name:  "poststop",
				Usage: "deregister the container (poststop hook of the standalone hooks.d path)",
				Flags: []cli.Flag{&cli.StringFlag{Name: "id", Usage: "tenant ID (default: the id in the OCI state)"}},
				Action: func(c *cli.Context) error {
					id := c.String("id")
					if id == "" {
						st, err := state(c)
						if err != nil {
							return err
						}
						id = st.ID
					}
					return hook.Poststop(cfg, id)
				},
			},
		},
	}
}
