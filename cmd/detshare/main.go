// Command detshare is DetShare's command-line tool: host checks, tenants without containers, the scheduler,
// installation and observability. Each subcommand lives in its own file; main lists them (commands).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/internal/loglevel"
)

// commands lists the subcommands, in the order help shows them.
func commands() []*cli.Command {
	return []*cli.Command{doctorCommand(), installCommand(), uninstallCommand(), runCommand(), schedCommand(),
		statusCommand(), topCommand(), tenantsCommand(), evictCommand(), schedRestartCommand(), cdiCommand(), versionCommand()}
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "detshare",
		Usage: "share one NVIDIA GPU between containers with bit-identical results and protected tail latency",
		Description: "DetShare partitions a GPU's SMs between tenants (containers or `detshare run` processes), " +
			"enforces per-tenant memory quotas, and migrates work only at kernel boundaries. " +
			"See README.md for the tier labels and annotations.",
		Version: version.Version,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "warning", EnvVars: []string{"DETSHARE_LOG_LEVEL"},
				Usage: "log verbosity: " + loglevel.Allowed},
			&cli.StringFlag{Name: "run-dir", Value: "/run/detshare", EnvVars: []string{"DETSHARE_RUN_DIR"},
				Usage: "directory holding the shared table, client pages and MPS directories"},
		},
		Before: func(c *cli.Context) error {
			return loglevel.Set("--log-level", c.String("log-level"))
		},
		Commands: commands(),
		// Without this urfave/cli answers an unknown command with "No help topic for …".
		Action: func(c *cli.Context) error {
			if !c.Args().Present() {
				return cli.ShowAppHelp(c)
			}
			var names []string
			for _, cmd := range c.App.Commands {
				if !cmd.Hidden {
					names = append(names, cmd.Name)
				}
			}
			return cli.Exit(fmt.Sprintf("unknown command %q: allowed commands are %s (detshare help COMMAND for details)",
				c.Args().First(), strings.Join(names, ", ")), 2)
		},
	}
}

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "detshare:", err)
		if ec, ok := err.(cli.ExitCoder); ok {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}
