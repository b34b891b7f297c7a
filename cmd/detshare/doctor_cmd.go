package main

import (
	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/doctor"
	"github.com/detshare/detshare/internal/layout"
)

func init() { commands = append(commands, doctorCommand()) }

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "inspect this host: NVIDIA driver and CUDA version, GPUs, MPS, container engines, DetShare registration",
		Description: "Prints each requirement, what was found and how to fix it. Exit status 0 means the host is ready, " +
			"1 means at least one check failed. With --simulated-gpu the simulated GPU (a test double built by " +
			"`make build`) stands in for the NVIDIA driver.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.BoolFlag{Name: "simulated-gpu", EnvVars: []string{"DETSHARE_SIMULATED_GPU"},
				Usage: "check the simulated GPU (test double) instead of the NVIDIA driver"},
			&cli.StringFlag{Name: "lib-dir", Value: layout.LibDir(), EnvVars: []string{"DETSHARE_LIB_DIR"},
				Usage: "directory holding libdetshare.so (and simgpu/ for the simulated GPU)"},
		},
		Action: func(c *cli.Context) error {
			r := doctor.Run(doctor.DefaultEnv(c.String("lib-dir"), c.Bool("simulated-gpu")))
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
