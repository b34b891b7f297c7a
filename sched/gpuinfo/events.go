package gpuinfo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/gpufacts"
)

// ErrNoEvents is returned (wrapped) by WatchXid when the driver's NVML has no event support (an old driver, the
// simulated GPU's double with DETSHARE_SIMGPU_NVML_EVENTS=0, a vGPU guest): Xid errors cannot be watched there.
var ErrNoEvents = errors.New("NVML has no event support")

// WatchXid registers every GPU NVML sees for critical Xid errors (nvmlEventSetCreate, nvmlDeviceRegisterEvents with
// nvmlEventTypeXidCriticalError, as NVIDIA's device plugin does) and then, in a goroutine of its own, calls fn with
// each one's GPU (NVML index) and Xid, waiting with nvmlEventSetWait, until ctx ends; a GPU lost (the wait's
// NVML_ERROR_GPU_IS_LOST) calls fn(gpufacts.AllGPUs, 0) at most once a second while it lasts. Setting up fails when NVML
// cannot be initialised (ErrNoDriver without the library) or has no event support (ErrNoEvents); a GPU that does not
// support Xid events is logged and left out. NVML stays initialised while the watch runs and is shut down after.
func WatchXid(ctx context.Context, fn func(gpu int, xid uint64)) error {
	if err := initNVML(); err != nil {
		return err
	}
	set, err := xidEventSet()
	if err != nil {
		nvml.Shutdown()
		return err
	}
	go func() {
		defer nvml.Shutdown()
		defer set.Free()
		for ctx.Err() == nil {
			e, ret := set.Wait(1000)
			switch {
			case ret == nvml.ERROR_TIMEOUT:
				continue
			case ret == nvml.ERROR_GPU_IS_LOST:
				// a GPU fell off the bus; NVML does not say which, so every GPU is reported (NVIDIA's device plugin
				// marks them all unhealthy too); waiting on returns the same until the driver is reloaded
				logrus.Error("NVML reports a GPU lost: every GPU is reported unhealthy")
				fn(gpufacts.AllGPUs, 0)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			case ret != nvml.SUCCESS:
				logrus.WithField("error", nvml.ErrorString(ret)).Warn("nvmlEventSetWait failed; watching on")
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			case e.EventType != nvml.EventTypeXidCriticalError:
				continue
			}
			idx, ret := e.Device.GetIndex()
			if ret != nvml.SUCCESS {
				logrus.WithFields(logrus.Fields{"xid": e.EventData, "error": nvml.ErrorString(ret)}).Warn("critical Xid on a GPU whose index NVML does not give")
				continue
			}
			fn(idx, e.EventData)
		}
	}()
	return nil
}

// xidEventSet creates the event set and registers each GPU's critical Xid events.
func xidEventSet() (set nvml.EventSet, err error) {
	// A driver whose NVML lacks the event calls: go-nvml would call a missing symbol.
	for _, sym := range []string{"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlDeviceGetSupportedEventTypes"} {
		if e := nvml.Extensions().LookupSymbol(sym); e != nil {
			return nil, fmt.Errorf("%w (%s: %v)", ErrNoEvents, sym, e)
		}
	}
	set, ret := nvml.EventSetCreate()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("%w (nvmlEventSetCreate: %s)", ErrNoEvents, nvml.ErrorString(ret))
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlEventSetCreate: %s", nvml.ErrorString(ret))
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		set.Free()
		return nil, fmt.Errorf("nvmlDeviceGetCount: %s", nvml.ErrorString(ret))
	}
	registered := 0
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			set.Free()
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", i, nvml.ErrorString(ret))
		}
		types, ret := dev.GetSupportedEventTypes()
		if ret == nvml.SUCCESS && types&nvml.EventTypeXidCriticalError != 0 {
			ret = dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)
		} else if ret == nvml.SUCCESS {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
		if ret != nvml.SUCCESS {
			logrus.WithFields(logrus.Fields{"gpu": i, "error": nvml.ErrorString(ret)}).Warn("GPU's critical Xid errors cannot be watched")
			continue
		}
		registered++
	}
	if registered == 0 {
		set.Free()
		return nil, fmt.Errorf("%w: no GPU supports critical Xid events", ErrNoEvents)
	}
	return set, nil
}
