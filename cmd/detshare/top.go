package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/detshare/detshare/sched/gpuinfo"
	"github.com/detshare/detshare/sched/view"
)

// topWidth is the width top is laid out for when the terminal does not say its own.
const topWidth = 80

// stdoutTerminal is terminalWidth; tests replace it.
var stdoutTerminal = terminalWidth

// terminalWidth returns stdout's terminal width and whether stdout is a terminal at all.
func terminalWidth() (int, bool) {
	ws, err := unix.IoctlGetWinsize(int(os.Stdout.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, false
	}
	if ws.Col == 0 {
		return topWidth, true
	}
	return int(ws.Col), true
}

func topCommand() *cli.Command {
	return &cli.Command{
		Name:  "top",
		Usage: "live per-GPU, per-tenant view (tier, granted SMs, busy %, launches/s, memory, queueing delay)",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh period"},
			&cli.IntFlag{Name: "iterations", Aliases: []string{"n"}, Usage: "stop after this many frames (0 = until ^C)"},
		},
		Action: func(c *cli.Context) error {
			iv := c.Duration("interval")
			if iv < 50*time.Millisecond {
				return cli.Exit(fmt.Sprintf("--interval %s: allowed values are >= 50ms", iv), 2)
			}
			t, err := openView(c.String("run-dir"))
			if err != nil {
				return err
			}
			defer t.Close()
			width, tty := stdoutTerminal()
			ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			nvmlMem := gpuinfo.ProcessMemorySampler() // nil without NVML: no memory-outside flag
			prev := view.Take(t)
			for n := 1; ; n++ {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(iv):
				}
				cur := view.Take(t)
				gpuMemory(&cur, t, nvmlMem)
				view.Rates(&prev, &cur)
				var b strings.Builder
				renderTop(&b, &prev, cur, width)
				out := b.String() + "\n" // not a terminal (a pipe, a file): plain frames, one after the other
				if tty {
					// Home, frame with each line cleared to its end, then clear below: refresh in place without flicker.
					out = "\x1b[H" + strings.ReplaceAll(b.String(), "\n", "\x1b[K\n") + "\x1b[J"
				}
				io.WriteString(os.Stdout, out)
				prev = cur
				if it := c.Int("iterations"); it > 0 && n >= it {
					return nil
				}
			}
		},
	}
}

var tierShort = map[string]string{"latency-critical": "LC", "burstable": "BU", "best-effort": "BE"}
var roleShort = map[string]string{"prefill": "pre", "decode": "dec", "none": "-"}

// renderTop lays out one frame in at most width columns (0: no limit).
func renderTop(w io.Writer, prev *view.Snapshot, s view.Snapshot, width int) {
	line := func(w io.Writer, s string) { clip(w, s, width) }
	sched := "scheduler DOWN (fail-static)"
	if s.Scheduler.Alive {
		sched = fmt.Sprintf("sched pid %d ep %d", s.Scheduler.PID, s.Scheduler.Epoch)
	}
	line(w, fmt.Sprintf("DetShare top  %s  %s  %s", s.Taken.Format("15:04:05"), sched, s.Scheduler.Policy))
	old := map[string]view.Tenant{}
	if prev != nil {
		for _, t := range prev.Tenants {
			old[t.ID] = t
		}
	}
	for _, g := range s.GPUs {
		sim := ""
		if g.Simulated {
			sim = " SIMULATED"
		}
		line(w, "")
		// The full name on its own line, the facts on the next: neither is cut at 80 columns.
		line(w, fmt.Sprintf("GPU %d  %s%s", g.Index, g.Name, sim))
		line(w, fmt.Sprintf("  %d SMs/%d grp  MPS %s  %s", g.SMs, len(g.Groups), g.MPS, g.Mode))
		// GUAR: guaranteed SMs; NOW: SMs granted now, "*" when some of them are also granted to another tenant
		// (grants overlap while tenants are idle, lend or share: the footer says which groups and whose).
		line(w, fmt.Sprintf("%-16s %-2s %-3s %4s %5s %5s %8s %15s %8s %5s", "TENANT", "T", "ROL", "GUAR", "NOW", "BUSY%", "LAUNCH/s", "MEM used/quota", "QDLY ms", "SLO%"))
		for _, t := range s.Tenants {
			if t.GPU != g.Index {
				continue
			}
			id := t.ID
			if len(id) > 16 {
				id = id[:15] + "~"
			}
			if g.TokenHolder == t.ID {
				id = "*" + id
				if len(id) > 16 {
					id = id[:16]
				}
			}
			now := fmt.Sprint(t.GrantedSMs)
			if t.SharedSMs > 0 {
				now += "*"
			}
			qd := float64(t.QueueDelayMaxNs) / 1e6
			if p, ok := old[t.ID]; ok && t.Launches > p.Launches && t.QueueDelayNs >= p.QueueDelayNs {
				qd = float64(t.QueueDelayNs-p.QueueDelayNs) / float64(t.Launches-p.Launches) / 1e6
			}
			slo := "-" // SLO attainment (issue 12): completions within slo-p99
			if t.SLOP99Ms > 0 && t.LatencyCount > 0 {
				slo = fmt.Sprintf("%.1f", 100*t.SLOAttainment)
			}
			if t.SLOState == "infeasible" {
				slo += "!" // missed even at the most protective share (issue 26; `status` says more)
			}
			mem := human(t.MemUsed) + "/" + limit(t.MemLimit)
			if t.MemOutsideFlagged {
				mem += "!" // the tenant's processes hold memory the library did not charge (`status` says how much)
			}
			line(w, fmt.Sprintf("%-16s %-2s %-3s %4d %5s %5.1f %8.0f %15s %8.2f %5s", id, tierShort[t.Tier], roleShort[t.Role],
				t.GuaranteedSMs, now, t.BusyPct, t.LaunchesSec, mem, qd, slo))
		}
		for _, l := range view.AccountLines(g, g.Account, s.Tenants) {
			line(w, "  "+l)
		}
		for _, t := range s.Tenants {
			if n := t.NarrowNote(); t.GPU == g.Index && n != "" {
				line(w, "  "+t.ID+": "+n)
			}
		}
	}
	if len(s.GPUs) == 0 {
		line(w, "no GPUs recorded in the table")
	}
}

func clip(w io.Writer, s string, width int) {
	if width > 0 && len(s) > width {
		s = s[:width]
	}
	fmt.Fprintln(w, s)
}
