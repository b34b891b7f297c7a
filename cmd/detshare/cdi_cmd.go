package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cmd/internal/wiring"
	"github.com/detshare/detshare/internal/layout"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
)

// cdiCommand prints the CDI spec DetShare gives containers, so the edit can be inspected (or installed in /etc/cdi
// for engines that inject CDI devices themselves) on a GPU host.
func cdiCommand() *cli.Command {
	return &cli.Command{
		Name:  "cdi",
		Usage: "show the CDI edit that gives a DetShare container its GPU",
		Subcommands: []*cli.Command{{
			Name:  "spec",
			Usage: "print the CDI spec (kind " + cdi.Kind + ", devices <index>, <uuid>, all) of the host's GPUs",
			Description: "Each GPU's edit is NVIDIA's (the nvidia.com/gpu spec that `nvidia-ctk cdi generate` wrote in " +
				strings.Join(cdi.SpecDirs, " or ") + ") when there is one, else generated from the driver's files: " +
				"/dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm(-tools), /dev/nvidia-modeset, the driver's libraries " +
				"and tools mounted read-only, and a createContainer hook (detshare-hook ldcache) that adds the library " +
				"directories to the container's loader cache. This is what the shim and the runc wrapper apply.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "gpu", Value: "all", Usage: "GPU index, UUID, or all"},
				&cli.StringFlag{Name: "root", Value: "/", Usage: "look for device nodes, driver files and CDI specs under this root (tests, chroots)"},
				&cli.StringFlag{Name: "format", Value: "yaml", Usage: "yaml or json"},
				&cli.StringFlag{Name: "hook", Usage: "detshare-hook path for the loader hook (default: next to this binary)"},
			},
			Action: func(c *cli.Context) error {
				format := c.String("format")
				if format != "yaml" && format != "json" {
					return cli.Exit(fmt.Sprintf("--format %q: allowed are yaml, json", format), 2)
				}
				hookPath := c.String("hook")
				if hookPath == "" {
					hookPath = layout.Sibling("detshare-hook")
				}
				var src cdi.Source = wiring.Devices(hookPath)
				root := c.String("root")
				if root != "/" && root != "" {
					src = cdi.Host{Root: root, HookPath: hookPath}
				}
				gpus, err := cdiGPUs(c.String("run-dir"), root)
				if err != nil {
					return err
				}
				sel, err := selectGPUs(gpus, c.String("gpu"))
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				var edits []cdi.Edit
				for _, g := range sel {
					e, err := src.Edit(g)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.ErrWriter, "GPU %d (%s): edit from %s\n", g.Index, g.UUID, e.From)
					edits = append(edits, e)
				}
				s := cdi.SpecFor(edits)
				var out []byte
				if format == "json" {
					out, err = json.MarshalIndent(s, "", "  ")
					out = append(out, '\n')
				} else {
					out, err = yaml.Marshal(s)
				}
				if err != nil {
					return err
				}
				_, err = c.App.Writer.Write(out)
				return err
			},
		}},
	}
}

// cdiGPUs lists the host's GPUs: the scheduler's table, else discovery (NVML, or the simulated GPU when the
// environment selects it), else the driver's /proc files under root.
func cdiGPUs(runDir, root string) ([]cdi.GPU, error) {
	var out []cdi.GPU
	if root == "/" || root == "" {
		if t, err := table.OpenReadOnly(table.RunDir(runDir)); err == nil {
			for _, g := range t.GPUs() {
				out = append(out, cdi.GPU{Index: g.Index, UUID: g.UUID})
			}
			t.Close()
			if len(out) > 0 {
				return out, nil
			}
		}
		if infos, err := wiring.GPUs(gpuinfo.Discover)(); err == nil {
			for _, g := range infos {
				out = append(out, cdi.GPU{Index: g.Index, UUID: g.UUID})
			}
			return out, nil
		}
	}
	gs, err := cdi.Driver{Root: root}.GPUs()
	if err != nil {
		return nil, fmt.Errorf("no GPUs: not in the table, not from NVML, and %w", err)
	}
	for i, g := range gs {
		out = append(out, cdi.GPU{Index: i, UUID: g.UUID})
	}
	return out, nil
}

func selectGPUs(gpus []cdi.GPU, sel string) ([]cdi.GPU, error) {
	if sel == "all" {
		return gpus, nil
	}
	var present []string
	for _, g := range gpus {
		if strconv.Itoa(g.Index) == sel || strings.EqualFold(g.UUID, sel) {
			return []cdi.GPU{g}, nil
		}
		present = append(present, fmt.Sprintf("%d (%s)", g.Index, g.UUID))
	}
	return nil, fmt.Errorf("--gpu %q: no such GPU; allowed are all, or one of %s", sel, strings.Join(present, ", "))
}
