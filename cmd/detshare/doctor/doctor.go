// Package doctor inspects a host and says what DetShare needs, what it found, and how to fix each gap. It backs
// `detshare doctor`; every check is a plain function so tests can run it against a fake root.
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Status is the outcome of one check.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn" // DetShare works, with less (e.g. no MPS: temporal quanta instead of SM partitions)
	Fail Status = "fail" // the host is not ready
	Info Status = "info" // not needed on this host (e.g. Docker absent while containerd is present)
)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Found  string `json:"found"`
	Need   string `json:"need,omitempty"`
	Fix    string `json:"fix,omitempty"`
}

// Report is the whole inspection.
type Report struct {
	Ready        bool    `json:"ready"`
	SimulatedGPU bool    `json:"simulated_gpu"`
	Checks       []Check `json:"checks"`
}

// Finish computes Ready: no check failed.
func (r *Report) Finish() {
	r.Ready = true
	for _, c := range r.Checks {
		if c.Status == Fail {
			r.Ready = false
		}
	}
}

// WriteText prints the report for people, one check per block.
func (r *Report) WriteText(w io.Writer) {
	if r.SimulatedGPU {
		fmt.Fprintln(w, "NOTE: the simulated GPU (a test double) is selected; no real GPU is used.")
	}
	for _, c := range r.Checks {
		fmt.Fprintf(w, "[%-4s] %-22s %s\n", strings.ToUpper(string(c.Status)), c.Name, c.Found)
		if c.Status != OK && c.Status != Info {
			if c.Need != "" {
				fmt.Fprintf(w, "       %-22s need: %s\n", "", c.Need)
			}
			if c.Fix != "" {
				fmt.Fprintf(w, "       %-22s fix:  %s\n", "", c.Fix)
			}
		}
	}
	switch {
	case r.Ready && r.SimulatedGPU:
		fmt.Fprintln(w, "host is ready for DetShare with the simulated GPU (a test double): no real GPU is shared")
	case r.Ready:
		fmt.Fprintln(w, "host is ready for DetShare")
	default:
		fmt.Fprintln(w, "host is NOT ready for DetShare: fix the [FAIL] lines above")
	}
}

// WriteJSON prints the report for machines.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
