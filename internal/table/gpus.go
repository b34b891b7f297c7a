package table

import (
	"fmt"
	"sync/atomic"
	"time"
)

// GPUInfo is what discovery (NVML in sched/gpuinfo, or the simulated GPU, a test double) knows about one GPU.
type GPUInfo struct {
	Index    int
	UUID     string
	Name     string
	SMCount  uint32
	MemTotal uint64 // bytes
}

// Split is a GPU's SM-group split as the driver made it: Groups[i] SMs in group i, and Remainder SMs in no group,
// which libdetshare runs with the last group (its green contexts include them, ds_pool.c): RunSizes.
type Split struct {
	MinSize   uint32
	Alignment uint32
	Groups    []uint32
	Remainder uint32
	// Published is true when the split was learnt from the driver and published in the table; false for an
	// estimate (EstimateSplit).
	Published bool
}

// TotalSMs returns the SMs in all groups.
func (s Split) TotalSMs() uint32 {
	var n uint32
	for _, g := range s.Groups {
		n += g
	}
	return n
}

// RunSizes returns the SMs each group's kernels run on: the groups, the remainder with the last one. Grants and
// guarantees count groups; what they amount to in SMs is this.
func (s Split) RunSizes() []uint32 {
	out := append([]uint32(nil), s.Groups...)
	if n := len(out); n > 0 {
		out[n-1] += s.Remainder
	}
	return out
}

// DefaultSplitMinSize is the SM granularity of compute capability 9.0+ (H100): splits come in groups of 8 SMs.
const DefaultSplitMinSize = 8

// EstimateSplit guesses the split of a GPU whose real split is not published yet. It is deliberately
// conservative: on an H100 (132 SMs) the driver gives 15 groups of 8 and leaves 12 SMs over, not 16 groups, because
// groups cannot straddle GPCs; so when smCount is not a multiple of minSize one group fewer is assumed.
func EstimateSplit(smCount, minSize uint32) Split {
	if minSize == 0 {
		minSize = DefaultSplitMinSize
	}
	n := smCount / minSize
	if smCount%minSize != 0 && n > 1 {
		n--
	}
	if n > MaxSMGroups {
		n = MaxSMGroups
	}
	s := Split{MinSize: minSize, Alignment: minSize, Groups: make([]uint32, n)}
	for i := range s.Groups {
		s.Groups[i] = minSize
	}
	s.Remainder = smCount - n*minSize
	return s
}

// GPUState is a snapshot of one GPU entry.
type GPUState struct {
	GPUInfo
	Split      Split // the published split, or EstimateSplit when none is published yet
	MPSState   uint32
	Mode       uint32
	MPSPipeDir string
	// Pressure is what the scheduler last published of the GPU's load (Pressure.At zero: never).
	Pressure Pressure
}

// SetGPUs records the discovered GPUs. Entries whose UUID is unchanged keep their split, MPS state and tokens, so a
// restarted scheduler or a repeated discovery does not disturb running tenants.
func (t *Table) SetGPUs(gpus []GPUInfo) error {
	if err := t.mustWrite("set GPUs"); err != nil {
		return err
	}
	if len(gpus) > MaxGPUs {
		return fmt.Errorf("set GPUs: %d GPUs, the table holds at most %d", len(gpus), MaxGPUs)
	}
	for i, g := range gpus {
		if g.Index != i {
			return fmt.Errorf("set GPUs: entry %d has index %d; GPUs must be listed in index order from 0", i, g.Index)
		}
		if len(g.UUID) == 0 || len(g.UUID) > 63 || len(g.Name) > 63 {
			return fmt.Errorf("set GPUs: GPU %d: uuid %q / name %q must be 1..63 / 0..63 bytes", i, g.UUID, g.Name)
		}
	}
	unlock, err := lockFile(t.paths.Lock())
	if err != nil {
		return err
	}
	defer unlock()
	for i := 0; i < MaxGPUs; i++ {
		e := t.GPU(i)
		if i >= len(gpus) {
			if atomic.LoadUint32(&e.State) != GPUAbsent {
				*e = GPU{}
			}
			continue
		}
		g := gpus[i]
		if atomic.LoadUint32(&e.State) == GPUPresent && cString(e.UUID[:]) == g.UUID {
			continue
		}
		atomic.StoreUint32(&e.State, GPUAbsent)
		*e = GPU{}
		e.Index = uint32(g.Index)
		putCString(e.UUID[:], g.UUID)
		putCString(e.Name[:], g.Name)
		e.MemTotal = g.MemTotal
		e.SMCount = g.SMCount
		atomic.StoreUint32(&e.State, GPUPresent)
	}
	atomic.StoreUint32(&t.Header().NGPUs, uint32(len(gpus)))
	return nil
}

// GPUs returns a snapshot of the present GPUs.
func (t *Table) GPUs() []GPUState {
	n := int(atomic.LoadUint32(&t.Header().NGPUs))
	if n > MaxGPUs {
		n = MaxGPUs
	}
	var out []GPUState
	for i := 0; i < n; i++ {
		e := t.GPU(i)
		if atomic.LoadUint32(&e.State) != GPUPresent {
			continue
		}
		out = append(out, t.gpuState(e))
	}
	return out
}

func (t *Table) gpuState(e *GPU) GPUState {
	s := GPUState{
		GPUInfo: GPUInfo{Index: int(e.Index), UUID: cString(e.UUID[:]), Name: cString(e.Name[:]),
			SMCount: e.SMCount, MemTotal: e.MemTotal},
		MPSState:   atomic.LoadUint32(&e.MPSState),
		Mode:       atomic.LoadUint32(&e.Mode),
		MPSPipeDir: cString(e.MPSPipeDir[:]),
	}
	if ns := atomic.LoadUint64(&e.PressureNs); ns != 0 {
		s.Pressure = Pressure{Compute: float64(atomic.LoadUint64(&e.PressureComputePPM)) / 1e6,
			MemBytes: atomic.LoadUint64(&e.PressureMemBytes), At: time.Unix(0, int64(ns))}
	}
	if atomic.LoadUint32(&e.SplitState) == SplitPublished {
		n := e.NGroups
		if n > MaxSMGroups {
			n = MaxSMGroups
		}
		s.Split = Split{MinSize: e.SplitMinSize, Alignment: e.SplitAlignment, Remainder: e.RemainderSMs,
			Groups: append([]uint32(nil), e.GroupSMs[:n]...), Published: true}
	} else {
		s.Split = EstimateSplit(e.SMCount, DefaultSplitMinSize)
	}
	return s
}

// PublishSplit publishes GPU gpu's split if nobody has yet (CAS UNKNOWN->PUBLISHING, fill, PUBLISHED with release
// order). It returns false when a split was already published or is being published.
func (t *Table) PublishSplit(gpu int, s Split) (bool, error) {
	if err := t.mustWrite("publish split"); err != nil {
		return false, err
	}
	if gpu < 0 || gpu >= MaxGPUs {
		return false, fmt.Errorf("publish split: gpu %d out of range 0..%d", gpu, MaxGPUs-1)
	}
	if len(s.Groups) == 0 || len(s.Groups) > MaxSMGroups {
		return false, fmt.Errorf("publish split: %d groups, allowed 1..%d", len(s.Groups), MaxSMGroups)
	}
	e := t.GPU(gpu)
	if !atomic.CompareAndSwapUint32(&e.SplitState, SplitUnknown, SplitPublishing) {
		return false, nil
	}
	e.SplitMinSize = s.MinSize
	e.SplitAlignment = s.Alignment
	e.RemainderSMs = s.Remainder
	for i := range e.GroupSMs {
		e.GroupSMs[i] = 0
	}
	copy(e.GroupSMs[:], s.Groups)
	atomic.StoreUint32(&e.NGroups, uint32(len(s.Groups)))
	atomic.StoreUint32(&e.SplitState, SplitPublished)
	return true, nil
}

// SetMPS records GPU gpu's MPS state, scheduling mode and MPS pipe directory (scheduler leader only).
func (t *Table) SetMPS(gpu int, mpsState, mode uint32, pipeDir string) error {
	if err := t.mustWrite("set MPS state"); err != nil {
		return err
	}
	if gpu < 0 || gpu >= MaxGPUs || len(pipeDir) > 127 {
		return fmt.Errorf("set MPS state: gpu %d (allowed 0..%d) or pipe dir %q (at most 127 bytes) invalid", gpu, MaxGPUs-1, pipeDir)
	}
	e := t.GPU(gpu)
	putCString(e.MPSPipeDir[:], pipeDir)
	atomic.StoreUint32(&e.Mode, mode)
	atomic.StoreUint32(&e.MPSState, mpsState)
	return nil
}
