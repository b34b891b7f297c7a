package daemon

import (
	"github.com/sirupsen/logrus"
)

// Compute modes as ComputeModes names them (nvidia-smi's names, lower case).
const (
	ComputeModeDefault          = "default"
	ComputeModeExclusiveProcess = "exclusive_process"
	ComputeModeProhibited       = "prohibited"
)

// ComputeModes reads and sets a GPU's compute mode, for `mps.exclusive` (issue 27): gpuinfo.NVMLComputeModes on
// real GPUs, simgpu.ComputeModes on the simulated GPU (a test double). The GPU is the table's index.
type ComputeModes interface {
	ComputeMode(gpu int) (string, error)
	SetComputeMode(gpu int, mode string) error
}

// setExclusive puts every GPU in EXCLUSIVE_PROCESS compute mode when the configuration asks for it (mps.exclusive
// with MPS on), before the MPS daemons start, and remembers each GPU's previous mode for restoreComputeModes. A GPU
// whose mode cannot be read or set is left as it is, with an error logged (`detshare doctor` shows the mode).
func (s *Scheduler) setExclusive() {
	c := s.conf.get()
	if !c.MPS.Enable || !c.MPS.Exclusive {
		return
	}
	cm := s.opts.ComputeModes
	if cm == nil {
		logrus.Warn("mps.exclusive = true, but this scheduler has no way to set compute modes: left as they are")
		return
	}
	for _, g := range s.t.GPUs() {
		log := logrus.WithField("gpu", g.Index)
		prev, err := cm.ComputeMode(g.Index)
		if err != nil {
			log.WithError(err).Error("mps.exclusive: compute mode not read; left as it is")
			continue
		}
		if prev == ComputeModeExclusiveProcess {
			continue
		}
		if err := cm.SetComputeMode(g.Index, ComputeModeExclusiveProcess); err != nil {
			log.WithError(err).Error("mps.exclusive: EXCLUSIVE_PROCESS compute mode not set; processes can leave MPS")
			continue
		}
		if s.modes == nil {
			s.modes = map[int]string{}
		}
		s.modes[g.Index] = prev
		log.WithField("previous", prev).Info("mps.exclusive: GPU in EXCLUSIVE_PROCESS compute mode")
	}
}

// restoreComputeModes gives every GPU setExclusive changed its previous compute mode back (the scheduler stops).
func (s *Scheduler) restoreComputeModes() {
	for gpu, prev := range s.modes {
		if err := s.opts.ComputeModes.SetComputeMode(gpu, prev); err != nil {
			logrus.WithError(err).WithFields(logrus.Fields{"gpu": gpu, "mode": prev}).
				Error("mps.exclusive: previous compute mode not restored")
			continue
		}
		delete(s.modes, gpu)
		logrus.WithFields(logrus.Fields{"gpu": gpu, "mode": prev}).Info("compute mode restored")
	}
}
