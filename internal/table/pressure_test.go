package table

import (
	"math"
	"testing"
	"time"
)

// The reaper's publication: per GPU, the sum of its tenants' busy fractions (each clamped to 1, however large a
// tenant writes its counter) and held memory (clamped to the GPU's), a young tenant counted by its role; GPUs()
// reads it back with its time. A tenant on another GPU does not count here.
func TestPublishPressureSumsEachGPUsTenants(t *testing.T) {
	tb := newTable(t)
	if err := tb.SetGPUs([]GPUInfo{{Index: 0, UUID: "SIM-p-0", SMCount: 132, MemTotal: 80 << 30},
		{Index: 1, UUID: "SIM-p-1", SMCount: 132, MemTotal: 80 << 30}}); err != nil {
		t.Fatal(err)
	}
	reg := func(id string, gpu int, role Role) *ClientPage {
		r, err := tb.Register(RegisterRequest{ID: id, Weight: 1, GPU: gpu, Role: role})
		if err != nil {
			t.Fatal(err)
		}
		cl, err := OpenClientPage(r.ClientPagePath)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl.Page()
	}
	now := time.Now().Add(100 * time.Second) // every tenant is ~100 s old then
	half := reg("half", 0, RoleNone)
	half.BusyNs, half.MemUsed = uint64(50*time.Second), 10<<30
	forged := reg("forged", 0, RoleNone)
	forged.BusyNs, forged.MemUsed = math.MaxUint64, math.MaxUint64
	reg("young-decode", 0, RoleDecode) // nothing measured: a quarter of the memory
	other := reg("other", 1, RoleNone)
	other.BusyNs = uint64(25 * time.Second)
	r := tb.NewReaper()
	defer r.Close()
	r.PublishPressure(now)
	gpus := tb.GPUs()
	p0, p1 := gpus[0].Pressure, gpus[1].Pressure
	if math.Abs(p0.Compute-1.5) > 0.01 || p0.MemBytes != 10<<30+80<<30+20<<30 || !p0.At.Equal(time.Unix(0, now.UnixNano())) {
		t.Fatalf("GPU 0 pressure %+v, want compute 1.5 (0.5 + forged clamped to 1), memory 110 GiB (10 + 80 clamped + 20), at %v", p0, now)
	}
	if math.Abs(p1.Compute-0.25) > 0.01 || p1.MemBytes != 0 {
		t.Fatalf("GPU 1 pressure %+v, want compute 0.25, no memory", p1)
	}
}
