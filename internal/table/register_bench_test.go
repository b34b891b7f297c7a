package table

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkRegisterNth is the cost of registering the n-th host tenant (`detshare run`: an owner PID, here this
// process) while n-1 host tenants are registered; the n-th is deregistered again outside the timer. Registration
// must cost the same at the 256th as at the 1st (issue 28: 0.3 ms -> 4.8 ms, a /proc read per host tenant on every
// registration). With admission=true the request carries an admission check that reads every active registration,
// as the registrar's does (it enumerates all n-1 of them); admission=false is the table's own work.
// A live leader is recorded (this process), as on a host where the scheduler runs: its reaper reaps dead host
// tenants, so registrations need not (with none, a registration reaps them itself, reading /proc per host tenant).
func BenchmarkRegisterNth(b *testing.B) {
	for _, admission := range []bool{true, false} {
		for _, n := range []int{1, 2, 16, 64, 128, 256} {
			b.Run(fmt.Sprintf("admission=%v/nth=%d", admission, n), func(b *testing.B) { benchRegisterNth(b, admission, n) })
		}
	}
}

func benchRegisterNth(b *testing.B, admission bool, n int) {
	tb, err := Create(b.TempDir() + "/run")
	if err != nil {
		b.Fatal(err)
	}
	defer tb.Close()
	if _, err := tb.SetLeader(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	req := func(id string) RegisterRequest {
		r := RegisterRequest{ID: id, Tier: TierBestEffort, GPU: 0, Weight: 1, OwnerPID: os.Getpid()}
		if admission {
			r.Check = func(active *Active, _ *RegisterRequest) error {
				var groups uint32
				for a := range active.All() {
					groups += a.SMGroups
				}
				if groups > MaxSMGroups*MaxContainers {
					return fmt.Errorf("admission: %d groups", groups)
				}
				return nil
			}
		}
		return r
	}
	for i := 1; i < n; i++ {
		if _, err := tb.Register(req(fmt.Sprint("host", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := tb.Register(req("nth")); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := tb.Deregister("nth"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkRegisterPageMount is one registration and its deregistration with the client page on a tmpfs of its own
// (tenants.page_mounts: a tmpfs, a bind, a remount, the staging mount detached; an unmount at deregistration) and as
// a file of the run directory. Needs root for the mounts.
func BenchmarkRegisterPageMount(b *testing.B) {
	for _, mounts := range []bool{false, true} {
		b.Run(fmt.Sprintf("page_mounts=%v", mounts), func(b *testing.B) {
			if mounts && os.Geteuid() != 0 {
				b.Skip("needs root to mount")
			}
			tb, err := Create(b.TempDir() + "/run")
			if err != nil {
				b.Fatal(err)
			}
			defer tb.Close()
			if _, err := tb.SetLeader(os.Getpid()); err != nil {
				b.Fatal(err)
			}
			tb.SetPageMounts(mounts)
			req := RegisterRequest{ID: "nth", Tier: TierBestEffort, GPU: 0, Weight: 1, OwnerPID: os.Getpid()}
			for i := 0; i < b.N; i++ {
				r, err := tb.Register(req)
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 && mounts {
					var st, dir unix.Stat_t
					if unix.Stat(r.ClientPagePath, &st) != nil || unix.Stat(tb.Paths().ClientsDir(), &dir) != nil ||
						st.Dev == dir.Dev {
						b.Fatal("the page is not on a tmpfs of its own")
					}
				}
				if err := tb.Deregister("nth"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
