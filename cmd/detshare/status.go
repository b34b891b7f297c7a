package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/view"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the scheduler, the GPUs and every tenant's grant (--json for scripts)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object (schema: sched/view.Snapshot)"},
			&cli.DurationFlag{Name: "interval", Value: 0,
				Usage: "sample twice this far apart to fill busy_percent and launches_per_second (0: cumulative counters only)"},
		},
		Action: func(c *cli.Context) error {
			runDir := c.String("run-dir")
			if c.Duration("interval") < 0 {
				return cli.Exit(fmt.Sprintf("--interval %s: must be >= 0", c.Duration("interval")), 2)
			}
			t, err := openView(runDir)
			if err != nil {
				return err
			}
			defer t.Close()
			snap := view.Take(t)
			if d := c.Duration("interval"); d > 0 {
				time.Sleep(d)
				next := view.Take(t)
				view.Rates(&snap, &next)
				snap = next
			}
			gpuMemory(&snap, t, gpuinfo.ProcessMemorySampler())
			if c.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(snap)
			}
			printStatus(os.Stdout, snap)
			return nil
		},
	}
}

// openView opens runDir's table read-only for status and top; without one it says once what is missing and what
// to do.
func openView(runDir string) (*table.Table, error) {
	if !view.RunDirExists(runDir) {
		return nil, cli.Exit(fmt.Sprintf("no DetShare table in %s: no scheduler has run and no tenant has registered there.\n"+
			"Start the scheduler (systemctl enable --now detshare-sched, or: sudo detshare sched), or start a tenant "+
			"(detshare run --tier burstable -- CMD, or a container with the detshare runtime); "+
			"if DetShare uses another run directory, pass --run-dir.", runDir), 1)
	}
	t, err := view.Open(runDir)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	return t, nil
}

func printStatus(w io.Writer, s view.Snapshot) {
	state := "not running (start it: systemctl start detshare-sched, or sudo detshare sched)"
	if s.Scheduler.Alive {
		state = fmt.Sprintf("pid %d, epoch %d, heartbeat %.1fs ago", s.Scheduler.PID, s.Scheduler.Epoch, s.Scheduler.HeartbeatAge)
	} else if s.Scheduler.PID != 0 {
		state = fmt.Sprintf("gone (last leader pid %d); tenants keep their last grants", s.Scheduler.PID)
	}
	fmt.Fprintf(w, "run dir   %s\nscheduler %s\npolicy    %s\n", s.RunDir, state, s.Scheduler.Policy)
	for _, g := range s.GPUs {
		sim := ""
		if g.Simulated {
			sim = " [simulated GPU, test double]"
		}
		fmt.Fprintf(w, "GPU %d  %s  %s%s\n  %d SMs in %d groups, MPS %s, mode %s", g.Index, g.UUID, g.Name, sim, g.SMs,
			len(g.Groups), g.MPS, g.Mode)
		if g.TokenHolder != "" {
			fmt.Fprintf(w, ", token held by %s", g.TokenHolder)
		}
		fmt.Fprintln(w)
		for _, t := range s.Tenants {
			if t.GPU != g.Index {
				continue
			}
			fmt.Fprintf(w, "  %-24s %-16s role %-7s weight %-3d SMs %3d guaranteed, %3d now (%s)  demand %d  mem %s / %s%s\n",
				t.ID, t.Tier, t.Role, t.Weight, t.GuaranteedSMs, t.GrantedSMs, t.GrantMode, t.Demand,
				human(t.MemUsed), limit(t.MemLimit), gpuMemNote(t))
			if sm := smLine(t); sm != "" {
				fmt.Fprintf(w, "  %-24s %s\n", "", sm)
			}
			if extra := latencyLine(t); extra != "" {
				fmt.Fprintf(w, "  %-24s %s\n", "", extra)
			}
		}
		for _, l := range view.AccountLines(g, g.Account, s.Tenants) {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if len(s.Tenants) == 0 {
		fmt.Fprintln(w, "no tenants")
	}
}

// smLine says what a tenant's grant holds besides its guarantee and with whom it shares groups; empty when the grant
// is its guarantee alone.
func smLine(t view.Tenant) string {
	var parts []string
	if t.BorrowedSMs > 0 {
		parts = append(parts, fmt.Sprintf("%d SMs borrowed beyond its guarantee (lent, expanded or shared groups)", t.BorrowedSMs))
	}
	if t.SharedSMs > 0 {
		parts = append(parts, fmt.Sprintf("%d SMs of its grant also granted to %s", t.SharedSMs, strings.Join(t.SharesWith, ", ")))
	}
	return strings.Join(parts, "; ")
}

// sloControllerLine says what the SLO controller chose for a latency-critical tenant and why (issue 26).
func sloControllerLine(t view.Tenant) string {
	switch t.SLOState {
	case "":
		return ""
	case "starting":
		return "controller: starting (most protective share until a window has enough completions)"
	case "infeasible":
		s := fmt.Sprintf("controller: SLO NOT ATTAINABLE beside these neighbours: p99 %.3gms even at the most protective "+
			"share (floor measured %.3gms; kernels in flight are never cut)", t.SLOWindowP99Ms, t.SLOFloorMs)
		if t.SLOHolding {
			// protection beyond this share bought the tenant nothing (policy.SLOControl.Holding)
			return s + fmt.Sprintf("; holding %d groups for lower tiers, the largest share whose p99 was within 10%% "+
				"of the floor", t.SLOGivenBackGroups)
		}
		return s + fmt.Sprintf("; %d groups left to lower tiers", t.SLOGivenBackGroups)
	case "missing":
		return fmt.Sprintf("controller: last window p99 %.3gms above the SLO: %d groups left to lower tiers (halved), tightest gate",
			t.SLOWindowP99Ms, t.SLOGivenBackGroups)
	}
	s := fmt.Sprintf("controller: last window p99 %.3gms within the SLO: %d groups of the GPU left to lower tiers",
		t.SLOWindowP99Ms, t.SLOGivenBackGroups)
	if t.SLOFloorMs > 0 {
		s += fmt.Sprintf(" (p99 %.3gms at the most protective share)", t.SLOFloorMs)
	}
	return s
}

// latencyLine is the issue-12 line of a tenant: pinning, SLO attainment from the latency its library observed,
// and the dispatch gate; empty when there is nothing to say.
func latencyLine(t view.Tenant) string {
	var parts []string
	if t.Pinned {
		parts = append(parts, "pinned")
	}
	if t.SLOP99Ms > 0 {
		if t.LatencyCount > 0 {
			parts = append(parts, fmt.Sprintf("SLO p99 %.3gms: observed p99 <= %.3gms, %.1f%% of %d completions within",
				t.SLOP99Ms, t.LatencyP99Ms, 100*t.SLOAttainment, t.LatencyCount))
		} else {
			parts = append(parts, fmt.Sprintf("SLO p99 %.3gms: no completions observed yet", t.SLOP99Ms))
		}
	}
	if c := sloControllerLine(t); c != "" {
		parts = append(parts, c)
	}
	if n := t.NarrowNote(); n != "" {
		parts = append(parts, n)
	}
	if t.GateDepth > 0 {
		parts = append(parts, fmt.Sprintf("gate %d kernels / %dus per stream (%d launches held, %.1f ms)", t.GateDepth,
			t.GateBudgetUs, t.GateWaits, float64(t.GateWaitNs)/1e6))
	}
	return strings.Join(parts, "; ")
}

func human(b uint64) string {
	const u = 1024
	if b < u {
		return fmt.Sprintf("%dB", b)
	}
	f, unit := float64(b), ""
	for _, x := range []string{"K", "M", "G", "T"} {
		f /= u
		unit = x
		if f < u {
			break
		}
	}
	return fmt.Sprintf("%.1f%s", f, unit)
}

func limit(b uint64) string {
	if b == 0 {
		return "-"
	}
	return human(b)
}

// gpuMemory fills the per-tenant device memory NVML reports (view.GPUMemory); without NVML (read nil) it stays
// unknown and nothing is said.
func gpuMemory(s *view.Snapshot, t *table.Table, read func(int) (map[int]uint64, error)) {
	if err := view.GPUMemory(s, t, read); err != nil {
		logrus.WithError(err).Debug("per-process GPU memory not read")
	}
}

// gpuMemNote is what status adds to a tenant's memory: what its processes hold on the GPU (NVML) and, flagged, how
// much of it the library did not charge (issue 27).
func gpuMemNote(t view.Tenant) string {
	switch {
	case !t.MemGPUKnown:
		return ""
	case t.MemOutsideFlagged:
		return fmt.Sprintf("  GPU %s: %s OUTSIDE the library (!)", human(t.MemGPU), human(t.MemOutside))
	}
	if t.MemOutside > 0 {
		return fmt.Sprintf("  GPU %s (%s of it the driver's contexts)", human(t.MemGPU), human(t.MemOutside))
	}
	return fmt.Sprintf("  GPU %s", human(t.MemGPU))
}
