package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/doctor"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/ensure"
	"github.com/detshare/detshare/sched/view"
)

// tenantsCommand lists the registered tenants: the package's prerm refuses removal while there are some, since a
// container whose runtime binary is gone can no longer be stopped or deleted by its engine.
func tenantsCommand() *cli.Command {
	return &cli.Command{
		Name:  "tenants",
		Usage: "list the registered tenants, one a line (ID, tier, GPU, pod), nothing when there are none",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print the IDs only"}},
		Action: func(c *cli.Context) error {
			runDir := table.RunDir(c.String("run-dir"))
			if !view.RunDirExists(runDir) {
				return nil
			}
			t, err := view.Open(runDir)
			if err != nil {
				return err
			}
			defer t.Close()
			for _, v := range view.Take(t).Tenants {
				if c.Bool("quiet") {
					fmt.Fprintln(c.App.Writer, v.ID)
					continue
				}
				line := fmt.Sprintf("%s\t%s\tgpu %d", v.ID, v.Tier, v.GPU)
				if v.Pod != "" {
					line += fmt.Sprintf("\tpod %s/%s container %s", v.Namespace, v.Pod, v.Container)
				}
				if v.HostTenant {
					line += "\t(detshare run)"
				}
				fmt.Fprintln(c.App.Writer, line)
			}
			return nil
		},
	}
}

// evictCommand deregisters a tenant on the operator's word, through the same table.Deregister the reaper's path
// ends in: the reaper trusts identities the tenant writes (its process entries), so a tenant that keeps a process
// alive, or fakes one, is never reaped; this is the remedy (docs/threat-model.md).
func evictCommand() *cli.Command {
	return &cli.Command{
		Name:      "evict",
		Usage:     "deregister a tenant: free its slot and SM guarantee and remove its files, as the reaper does for a dead one",
		ArgsUsage: "<tenant-id>",
		Description: "Removes the tenant <tenant-id> (an ID as `detshare tenants` lists it) from the table: its slot, its\n" +
			"guaranteed SM groups and its memory quota go back to the others at the scheduler's next pass, and its\n" +
			"client page and tenant directory are removed.\n\n" +
			"Its processes are NOT killed, but they belong to no tenant any more: at their next launch their GPU work\n" +
			"(launches, copies, memsets) is held until they exit, so they never run on SMs that are now someone\n" +
			"else's, and they keep their device memory until they exit (under MPS the scheduler ends their MPS\n" +
			"client, which frees it). Stop them (docker stop, kubectl delete pod, kill) to clean up; the container's deletion\n" +
			"then finds the tenant gone and succeeds. Needs write access to the run directory (root).",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("evict: want exactly one <tenant-id>, got %d arguments (`detshare tenants` lists the IDs)", c.NArg())
			}
			id := c.Args().First()
			if err := table.ValidateID(id); err != nil {
				return fmt.Errorf("evict %q: %w", id, err)
			}
			runDir := table.RunDir(c.String("run-dir"))
			if !view.RunDirExists(runDir) {
				return fmt.Errorf("evict %q: no DetShare table in %s (wrong --run-dir?)", id, runDir)
			}
			t, err := table.Open(runDir)
			if err != nil {
				return fmt.Errorf("evict %q: %w", id, err)
			}
			defer t.Close()
			var slot = -1
			for _, r := range t.List() {
				if r.ID == id {
					slot = r.Slot
				}
			}
			if err := t.Deregister(id); errors.Is(err, table.ErrNotFound) {
				var ids []string
				for _, r := range t.List() {
					ids = append(ids, r.ID)
				}
				registered := "none"
				if len(ids) > 0 {
					registered = strings.Join(ids, ", ")
				}
				return fmt.Errorf("evict %q: not registered in %s; registered tenants: %s", id, runDir, registered)
			} else if err != nil {
				return fmt.Errorf("evict %q: %w", id, err)
			}
			t.RingDoorbell() // the scheduler hands the freed groups out now, not at its next tick
			fmt.Fprintf(c.App.Writer, "evicted %s (slot %d); its processes, if any still run, have their GPU work held until they exit: stop them\n", id, slot)
			return nil
		},
	}
}

// schedRestartCommand restarts the running scheduler, e.g. after an upgrade replaced its binary (the .deb's
// postinst runs it with --if-stale). Tenants keep their last grants while no scheduler runs (fail-static).
func schedRestartCommand() *cli.Command {
	return &cli.Command{
		Name:  "sched-restart",
		Usage: "restart the running scheduler (through systemd when it runs as detshare-sched); tenants keep their grants meanwhile",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "if-stale", Usage: "only when it runs an old binary (deleted, or not the installed detshare)"},
		},
		Action: func(c *cli.Context) error {
			runDir := table.RunDir(c.String("run-dir"))
			w := c.App.Writer
			pid := doctor.LeaderPID(runDir)
			if pid <= 0 {
				fmt.Fprintf(w, "no scheduler runs for %s: nothing to restart (the first tenant starts one)\n", runDir)
				return nil
			}
			bin, err := ensure.Binary()
			if err != nil {
				return err
			}
			s, err := doctor.InspectSchedulerExe("/proc", pid, bin)
			if err != nil {
				return err
			}
			if c.Bool("if-stale") && !s.Stale {
				fmt.Fprintf(w, "scheduler pid %d runs the installed %s: left running\n", pid, bin)
				return nil
			}
			if s.Stale {
				fmt.Fprintf(w, "scheduler pid %d runs an old binary (%s): restarting it\n", pid, s.Why)
			}
			if underSystemd(pid) {
				out, err := exec.Command("systemctl", "restart", "detshare-sched.service").CombinedOutput()
				if err != nil {
					return fmt.Errorf("systemctl restart detshare-sched: %w: %s", err, strings.TrimSpace(string(out)))
				}
				fmt.Fprintln(w, "restarted detshare-sched.service")
				return nil
			}
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				return fmt.Errorf("stop scheduler pid %d: %w", pid, err)
			}
			for deadline := time.Now().Add(10 * time.Second); ensure.LeaderRunning(runDir); {
				if time.Now().After(deadline) {
					return fmt.Errorf("scheduler pid %d still holds %s 10s after SIGTERM", pid, table.NewPaths(runDir).SchedLock())
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := ensure.EnsureScheduler(runDir); err != nil {
				return fmt.Errorf("start the new scheduler: %w", err)
			}
			fmt.Fprintf(w, "scheduler restarted from %s (pid %d)\n", bin, doctor.LeaderPID(runDir))
			return nil
		},
	}
}

// underSystemd tells whether pid runs in detshare-sched.service's cgroup.
func underSystemd(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(data), "/detshare-sched.service")
}
