package deviceplugin

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/detshare/detshare/internal/table"
)

// Health reports the node's unhealthy GPUs: index → why, a short word that is also a valid label value
// ("mps-failed"). nil or empty: every GPU is healthy.
type Health func() map[int]string

// Unhealthy reasons.
const (
	// ReasonMPSFailed: the scheduler records the GPU's MPS as failed (its control daemon failed to start or to
	// restart): new MPS clients on it would fail.
	ReasonMPSFailed = "mps-failed"
)

// TableHealth reads the GPUs' health from the scheduler's table in runDir, as the scheduler reports it: a GPU whose
// MPS failed (table.MPSFailed: its control daemon failed to start or to restart) is unhealthy until the scheduler
// records it running again. Without a table (no scheduler yet) every GPU is healthy: the runtime refuses tenants then
// anyway.
func TableHealth(runDir string) Health {
	return func() map[int]string {
		tb, err := table.OpenReadOnly(runDir)
		if err != nil {
			return nil
		}
		defer tb.Close()
		var out map[int]string
		for _, g := range tb.GPUs() {
			if g.MPSState == table.MPSFailed {
				if out == nil {
					out = map[int]string{}
				}
				out[g.Index] = ReasonMPSFailed
			}
		}
		return out
	}
}

func (h Health) now() map[int]string {
	if h == nil {
		return nil
	}
	return h()
}

// ErrRetry, returned (wrapped) by Watch's changed, keeps the view it was offered unaccepted: the next poll offers
// the change again.
var ErrRetry = errors.New("retry at the next poll")

// Watch polls h every interval (0: 1 s) until ctx ends, calling changed with each view that differs from the last
// one accepted (starting from last). changed's error ends the watch, unless it is ErrRetry.
func (h Health) Watch(ctx context.Context, every time.Duration, last map[int]string, changed func(now, was map[int]string) error) error {
	if every <= 0 {
		every = time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := h.now()
		if maps.Equal(now, last) {
			continue
		}
		if err := changed(now, last); errors.Is(err, ErrRetry) {
			continue
		} else if err != nil {
			return err
		}
		last = now
	}
}
