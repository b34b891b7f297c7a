package quota

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/detshare/detshare/internal/quote"
)

// QuotaFileVersion is the version= of the quota file format.
const QuotaFileVersion = 1

// File is the quota file libdetshare reads at start (docs/internals.md "The quota file"): exactly the keys the
// library reads (cgroupgpu/libdetshare/src/ds_tenant.c). Everything else about a tenant (tier, SMs, weight, role,
// lend, the memory limit) is in its table registration, which the library and the scheduler read; a copy here
// could only go stale.
type File struct {
	Version int
	ID      string
	Slot    int
	SlotGen uint32
	GPU     int // the tenant's GPU, where the table slot does not name one
	FilePaths
}

// FilePaths are the paths a quota file names. They are all that differs between a tenant's host copy and its
// container copy (the same files as the container sees them).
type FilePaths struct {
	Table      string
	ClientPage string
	Doorbell   string
	MPSPipeDir string // "" = no MPS server
}

// Validate checks that f can be written: one value per line, so no value may contain a line break or NUL.
func (f File) Validate() error {
	for k, v := range map[string]string{"id": f.ID, "table": f.Table, "client_page": f.ClientPage,
		"doorbell": f.Doorbell, "mps_pipe_dir": f.MPSPipeDir} {
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("quota file %s=%s: values cannot contain line breaks or NUL", k, quote.Q(v))
		}
	}
	return nil
}

// Render writes f in the quota file format (call Validate first when the values come from outside).
func Render(f File) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# DetShare quota file, written at registration; format: docs/internals.md\n")
	fmt.Fprintf(&b, "version=%d\n", QuotaFileVersion)
	fmt.Fprintf(&b, "id=%s\n", f.ID)
	fmt.Fprintf(&b, "slot=%d\n", f.Slot)
	fmt.Fprintf(&b, "slot_gen=%d\n", f.SlotGen)
	fmt.Fprintf(&b, "gpu=%d\n", f.GPU)
	fmt.Fprintf(&b, "table=%s\n", f.Table)
	fmt.Fprintf(&b, "client_page=%s\n", f.ClientPage)
	fmt.Fprintf(&b, "doorbell=%s\n", f.Doorbell)
	fmt.Fprintf(&b, "mps_pipe_dir=%s\n", f.MPSPipeDir)
	return b.Bytes()
}

// ParseFile parses a quota file. Unknown keys are ignored (newer writers may add keys, and files written before the
// format held only what the library reads still carry tier, sms, memory, weight and role); missing required keys and
// malformed values are errors naming the line.
func ParseFile(data []byte) (File, error) {
	f := File{Slot: -1}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return File{}, fmt.Errorf("quota file line %d: %s is not key=value", line, quote.Q(s))
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		seen[k] = true
		var err error
		num := func(bits int) uint64 {
			var n uint64
			n, err = strconv.ParseUint(v, 10, bits)
			return n
		}
		switch k {
		case "version":
			f.Version = int(num(16))
			if err == nil && f.Version != QuotaFileVersion {
				err = fmt.Errorf("version %d, this DetShare reads version %d", f.Version, QuotaFileVersion)
			}
		case "id":
			f.ID = v
		case "slot":
			f.Slot = int(num(16))
		case "slot_gen":
			f.SlotGen = uint32(num(32))
		case "gpu":
			f.GPU = int(num(16))
		case "table":
			f.Table = v
		case "client_page":
			f.ClientPage = v
		case "doorbell":
			f.Doorbell = v
		case "mps_pipe_dir":
			f.MPSPipeDir = v
		}
		if err != nil {
			return File{}, fmt.Errorf("quota file line %d: %s=%s: %w", line, quote.Bounded(k), quote.Q(v), numCause(err))
		}
	}
	if err := sc.Err(); err != nil {
		return File{}, fmt.Errorf("read quota file: %w", err)
	}
	for _, k := range []string{"version", "id", "slot", "slot_gen", "table", "client_page"} {
		if !seen[k] {
			return File{}, fmt.Errorf("quota file: required key %q missing", k)
		}
	}
	return f, nil
}

// numCause drops strconv's copy of the input from a parse error (it would echo the whole value) and keeps why.
func numCause(err error) error {
	var ne *strconv.NumError
	if errors.As(err, &ne) {
		return ne.Err
	}
	return err
}
