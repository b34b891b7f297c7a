// Package failopen records each time a tenant that asked for DetShare ran without it because the host configured
// fail-open ([tenants] fail_open in /etc/detshare/config.toml). The container components and `detshare run` append
// a line per event to <run dir>/fail-open.log; the scheduler exports the count as detshare_fail_open_total and
// `detshare doctor` reports it. The file is bounded: past MaxBytes further events are counted in the log line of
// the component that failed only.
package failopen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// FileName is the event log in the run directory.
const FileName = "fail-open.log"

// MaxBytes bounds the log (about 4000 events).
const MaxBytes = 1 << 20

// maxReason bounds one event's reason (it may echo tenant input).
const maxReason = 240

// Event is one line of the log.
type Event struct {
	Time   string `json:"time"`
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// Record appends an event when runDir exists (it never creates the run directory: a host where DetShare could not
// start must not be left with one).
func Record(runDir, id string, reason error) error {
	if st, err := os.Stat(runDir); err != nil || !st.IsDir() {
		return fmt.Errorf("fail-open not recorded: run dir %s: not a directory", runDir)
	}
	p := filepath.Join(runDir, FileName)
	if st, err := os.Stat(p); err == nil && st.Size() >= MaxBytes {
		return fmt.Errorf("fail-open not recorded: %s is full", p)
	}
	msg := ""
	if reason != nil {
		msg = reason.Error()
	}
	if len(msg) > maxReason {
		msg = msg[:maxReason] + "…"
	}
	line, _ := json.Marshal(Event{Time: time.Now().UTC().Format(time.RFC3339), ID: id, Reason: msg})
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return fmt.Errorf("fail-open not recorded: %w", err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("fail-open not recorded: %w", err)
	}
	return nil
}

// Count returns how many events runDir's log holds (0 when there is none).
func Count(runDir string) uint64 {
	data, err := os.ReadFile(filepath.Join(runDir, FileName))
	if err != nil {
		return 0
	}
	return uint64(bytes.Count(data, []byte{'\n'}))
}

// Last returns the newest event, if any.
func Last(runDir string) (Event, bool) {
	data, err := os.ReadFile(filepath.Join(runDir, FileName))
	if err != nil {
		return Event{}, false
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte{'\n'})
	var e Event
	if len(lines) == 0 || json.Unmarshal(lines[len(lines)-1], &e) != nil {
		return Event{}, false
	}
	return e, true
}
