package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/gpufacts"
)

// Critical Xid errors (NVML events): a GPU that reports one is unhealthy, reason xid-<n> (a valid label value), for
// the hold time after its last one (XidHealth.Hold; 0: until the plugin restarts, as NVIDIA's device plugin keeps
// it). Xids an application causes on its own context are ignored, as NVIDIA's device plugin ignores them.

// DefaultIgnoredXids are the application-caused Xids NVIDIA's device plugin ignores by default: 13 (graphics engine
// exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video decoder
// exception), 109 (context switch timeout).
const DefaultIgnoredXids = "13,31,43,45,68,109"

// ReasonGPULost is the unhealthy reason of every GPU once NVML reports a GPU lost (fallen off the bus): NVML does not
// say which, so none is trusted until the hold passes (or the plugin restarts, after the driver is reloaded).
const ReasonGPULost = "gpu-lost"

// ReasonXid is the unhealthy reason of a GPU that reported critical Xid xid.
func ReasonXid(xid uint64) string { return "xid-" + strconv.FormatUint(xid, 10) }

// ParseIgnoredXids reads flag's value: a comma-separated list of Xid numbers, or "none" (or "") for none.
func ParseIgnoredXids(flag, v string) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	v = strings.TrimSpace(v)
	if v == "" || v == "none" {
		return out, nil
	}
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %q is not an Xid: allowed values are none or a comma-separated list of Xid numbers (default %s)",
				flag, v, strings.TrimSpace(f), DefaultIgnoredXids)
		}
		out[n] = true
	}
	return out, nil
}

// XidHealth turns critical Xid events into GPU health.
type XidHealth struct {
	Ignored map[uint64]bool  // Xids that do not make a GPU unhealthy
	Hold    time.Duration    // how long a GPU stays unhealthy after its last critical Xid; 0: until restart
	Now     func() time.Time // nil: time.Now
	// GPUs are the node's GPU indices: all of them are unhealthy (ReasonGPULost) when NVML reports a GPU lost.
	GPUs []int

	mu   sync.Mutex
	last map[int]xidSeen // GPU index → its last counted Xid
	lost time.Time       // when NVML last reported a GPU lost; zero: never
}

type xidSeen struct {
	xid uint64
	at  time.Time
}

func (x *XidHealth) now() time.Time {
	if x.Now != nil {
		return x.Now()
	}
	return time.Now()
}

// Observe records critical Xid xid on GPU gpu, or a GPU lost (gpu gpufacts.AllGPUs); it tells whether it counts (the
// Xid is not ignored).
func (x *XidHealth) Observe(gpu int, xid uint64) bool {
	if gpu == gpufacts.AllGPUs {
		x.mu.Lock()
		x.lost = x.now()
		x.mu.Unlock()
		logrus.WithField("gpus", x.GPUs).Error("NVML reports a GPU lost: every GPU of the node is unhealthy")
		return true
	}
	log := logrus.WithFields(logrus.Fields{"gpu": gpu, "xid": xid})
	if x.Ignored[xid] {
		log.Info("Xid error ignored (application-caused; --xid-ignored)")
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.last == nil {
		x.last = map[int]xidSeen{}
	}
	x.last[gpu] = xidSeen{xid: xid, at: x.now()}
	hold := "until the plugin restarts"
	if x.Hold > 0 {
		hold = "until " + x.Hold.String() + " pass without another"
	}
	log.Error("critical Xid error: the GPU is unhealthy " + hold)
	return true
}

// Health is the GPUs whose last critical Xid is within the hold time, reason ReasonXid.
func (x *XidHealth) Health() Health {
	return func() map[int]string {
		x.mu.Lock()
		defer x.mu.Unlock()
		var out map[int]string
		now := x.now()
		if !x.lost.IsZero() && x.Hold > 0 && now.Sub(x.lost) >= x.Hold {
			logrus.WithField("hold", x.Hold).Info("no GPU lost for the hold time: the GPUs are healthy again")
			x.lost = time.Time{}
		}
		if !x.lost.IsZero() {
			out = make(map[int]string, len(x.GPUs))
			for _, g := range x.GPUs {
				out[g] = ReasonGPULost
			}
		}
		for gpu, s := range x.last {
			if x.Hold > 0 && now.Sub(s.at) >= x.Hold {
				logrus.WithFields(logrus.Fields{"gpu": gpu, "xid": s.xid, "hold": x.Hold}).Info("no critical Xid error for the hold time: the GPU is healthy again")
				delete(x.last, gpu)
				continue
			}
			if out == nil {
				out = map[int]string{}
			}
			if _, lost := out[gpu]; !lost {
				out[gpu] = ReasonXid(s.xid)
			}
		}
		return out
	}
}

// XidWatch starts watching critical Xid errors until ctx ends, calling fn with each one's GPU and Xid (the binaries
// wire in sched/gpuinfo.WatchXid, NVML's events); its error says why it cannot (no NVML, no event support).
type XidWatch func(ctx context.Context, fn func(gpu int, xid uint64)) error

// Watch starts watch until ctx ends and returns x's Health. Where it cannot watch (NVML not reachable from this
// container, no event support) it logs why and returns a Health that reports nothing: the GPUs' health then follows
// the scheduler alone.
func (x *XidHealth) Watch(ctx context.Context, watch XidWatch) Health {
	if err := watch(ctx, func(gpu int, xid uint64) { x.Observe(gpu, xid) }); err != nil {
		logrus.WithError(err).Warn("critical Xid errors are not watched")
		return nil
	}
	ignored := make([]uint64, 0, len(x.Ignored))
	for n := range x.Ignored {
		ignored = append(ignored, n)
	}
	slices.Sort(ignored)
	logrus.WithFields(logrus.Fields{"ignored": ignored, "hold": x.Hold}).Info("watching critical Xid errors (NVML events)")
	return x.Health()
}
