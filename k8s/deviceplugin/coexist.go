package deviceplugin

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/kubeletdevices"
)

// Coexistence with another GPU device plugin on the node (NVIDIA's, the GPU Operator's): kubelet records every
// plugin's healthy devices in its device-manager checkpoint, and NVIDIA's device plugin names each GPU by its UUID
// ("GPU-…", "GPU-…::<n>" when it time-slices). A GPU that another resource advertises there is not DetShare's: its
// units are sent Unhealthy (kubelet allocates none of them) and the plugin is not ready, until the other plugin
// stops advertising it.

// ReasonClaimedElsewhere: another device plugin registered with kubelet advertises the GPU.
const ReasonClaimedElsewhere = "claimed-by-other-plugin"

// Claims reads kubelet's checkpoint in dir and returns, for each GPU of inv that a resource other than DetShare's
// advertises, those resources (sorted). No checkpoint (kubelet has none yet) is no claim.
func Claims(dir string, inv Inventory) (map[int][]string, error) {
	reg, err := kubeletdevices.Registered(dir)
	if err != nil {
		return nil, err
	}
	ours := func(res string) bool { return res == ResourceShares || res == ResourceMemory }
	var out map[int][]string
	for _, g := range inv.GPUs {
		if res := kubeletdevices.Claimants(reg, g.UUID, ours); len(res) > 0 {
			if out == nil {
				out = map[int][]string{}
			}
			out[g.Index] = res
		}
	}
	return out, nil
}

// ClaimHealth is a Health that reports the GPUs of inv another device plugin advertises (Claims in dir) as
// ReasonClaimedElsewhere, logging each new claim as an error naming the GPU and the other resource. An unreadable
// checkpoint is logged and claims nothing.
func ClaimHealth(dir string, inv Inventory) Health {
	report := ClaimReport(inv, func(g GPU, res []string) {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID, "resources": res}).Error(
			"another device plugin advertises this GPU: DetShare does not serve it (its units are Unhealthy) " +
				"until that plugin stops; give the GPU to one of them (docs/kubernetes.md \"Coexistence\")")
	}, func(g GPU) {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID}).Info("no other device plugin advertises this GPU any more")
	})
	return func() map[int]string {
		claims, err := Claims(dir, inv)
		if err != nil {
			logrus.WithError(err).Warn("cannot tell whether another device plugin advertises the GPUs")
			return nil
		}
		return report(claims)
	}
}

// ClaimReport turns each view of the GPUs of inv that another plugin or driver claims (index → its claimants) into
// their health, ReasonClaimedElsewhere, calling claimed for each GPU whose claimants changed to some and released for
// each that no one claims any more. It is safe for concurrent use (both resources' ListAndWatch poll it).
func ClaimReport(inv Inventory, claimed func(g GPU, by []string), released func(g GPU)) func(claims map[int][]string) map[int]string {
	var mu sync.Mutex
	var last map[int][]string
	return func(claims map[int][]string) map[int]string {
		mu.Lock()
		defer mu.Unlock()
		if !maps.EqualFunc(claims, last, slices.Equal) {
			for _, g := range inv.GPUs {
				if by := claims[g.Index]; len(by) > 0 {
					claimed(g, by)
				} else if len(last[g.Index]) > 0 {
					released(g)
				}
			}
			last = claims
		}
		var out map[int]string
		for i := range claims {
			if out == nil {
				out = map[int]string{}
			}
			out[i] = ReasonClaimedElsewhere
		}
		return out
	}
}

// Or is the union of h and o: a GPU either reports unhealthy is unhealthy, with h's reason first.
func (h Health) Or(o Health) Health {
	return func() map[int]string {
		a, b := h.now(), o.now()
		if len(b) == 0 {
			return a
		}
		out := maps.Clone(a)
		if out == nil {
			out = map[int]string{}
		}
		for i, r := range b {
			if out[i] == "" {
				out[i] = r
			}
		}
		return out
	}
}

// Select keeps the GPUs of inv that spec names: "all", or a comma-separated list of indexes and UUIDs (the
// plugin's --gpus). A name that matches no GPU is an error naming the GPUs found.
func (inv Inventory) Select(spec string) (Inventory, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return inv, nil
	}
	var found []string
	for _, g := range inv.GPUs {
		found = append(found, fmt.Sprintf("%d (%s)", g.Index, g.UUID))
	}
	out := inv
	out.GPUs = nil
	for _, name := range strings.Split(spec, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(inv.GPUs, func(g GPU) bool { return name != "" && (strconv.Itoa(g.Index) == name || g.UUID == name) })
		if i < 0 {
			return Inventory{}, fmt.Errorf("--gpus=%q: no GPU %q on this node: allowed values are all or a comma-separated list of "+
				"the GPUs' indexes or UUIDs: %s", spec, name, strings.Join(found, ", "))
		}
		if !slices.ContainsFunc(out.GPUs, func(g GPU) bool { return g.Index == inv.GPUs[i].Index }) {
			out.GPUs = append(out.GPUs, inv.GPUs[i])
		}
	}
	return out, nil
}

// Readiness keeps file present while every GPU of inv is served (health reports none claimed by another plugin):
// the chart's readiness probe reads it. Its content names the GPUs served. It returns the Health to watch, which
// updates the file whenever the verdict changes; file "" turns it off.
func Readiness(file string, inv Inventory, h Health) Health {
	if file == "" {
		return h
	}
	var mu sync.Mutex
	ready := -1
	return func() map[int]string {
		now := h.now()
		mu.Lock()
		defer mu.Unlock()
		ok := true
		for _, r := range now {
			ok = ok && r != ReasonClaimedElsewhere
		}
		if (ready == 1) == ok && ready != -1 {
			return now
		}
		if ok {
			var b strings.Builder
			for _, g := range inv.GPUs {
				fmt.Fprintf(&b, "gpu %d %s served\n", g.Index, g.UUID)
			}
			if err := atomicfile.Write(file, []byte(b.String()), 0o644, false); err != nil {
				logrus.WithError(err).WithField("file", file).Warn("readiness file not written")
				return now
			}
			ready = 1
		} else {
			if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
				logrus.WithError(err).WithField("file", file).Warn("readiness file not removed")
				return now
			}
			ready = 0
		}
		return now
	}
}
