package gpuinfo

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Board is one read-only sample of a GPU's power draw, its enforced power limit and its SM clock.
type Board struct {
	PowerW     float64
	LimitW     float64
	SMClockMHz uint32
}

// Near tells whether the draw is at or above frac of the limit (false when the limit is unknown).
func (b Board) Near(frac float64) bool { return frac > 0 && b.LimitW > 0 && b.PowerW >= frac*b.LimitW }

// BoardSampler returns a function reading GPU index's Board through NVML (queries only: DetShare never changes
// card settings), or nil when NVML cannot be initialised. NVML stays initialised for the process's life.
func BoardSampler() func(index int) (Board, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil
	}
	devs := &deviceCache{}
	return func(index int) (Board, error) {
		dev, err := devs.get(index)
		if err != nil {
			return Board{}, err
		}
		var b Board
		mw, ret := dev.GetPowerUsage()
		if ret != nvml.SUCCESS {
			return Board{}, fmt.Errorf("nvmlDeviceGetPowerUsage(%d): %s", index, nvml.ErrorString(ret))
		}
		b.PowerW = float64(mw) / 1000
		if lim, ret := dev.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
			b.LimitW = float64(lim) / 1000
		}
		if clk, ret := dev.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
			b.SMClockMHz = clk
		}
		return b, nil
	}
}

// deviceCache keeps the NVML handle of each GPU index a sampler asked for (NVML initialised by its caller).
type deviceCache struct {
	mu   sync.Mutex
	devs map[int]nvml.Device
}

func (c *deviceCache) get(index int) (nvml.Device, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.devs[index]; ok {
		return d, nil
	}
	d, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", index, nvml.ErrorString(ret))
	}
	if c.devs == nil {
		c.devs = map[int]nvml.Device{}
	}
	c.devs[index] = d
	return d, nil
}
