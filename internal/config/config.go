// Package config loads the host configuration, /etc/detshare/config.toml (commented example in
// configs/detshare/config.toml). Every field has a default, so a missing file is not an error; a bad value is,
// naming the key, the value and what is allowed. Both wings read it: the scheduler (sched/daemon) all of it, the
// container path (hook) the tenants section's fail_open; so it stands under both and imports no scheduler code.
// The scheduler section converts to plain PolicyOptions, which sched/daemon turns into sched/policy.Options.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/detshare/detshare/internal/table"
)

// DefaultPath is where `detshare sched` reads its configuration unless --config says otherwise.
const DefaultPath = "/etc/detshare/config.toml"

// EnvPath names another configuration file (all DetShare components honour it).
const EnvPath = "DETSHARE_CONFIG"

// PathFromEnv is $DETSHARE_CONFIG, else DefaultPath.
func PathFromEnv() string {
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}

// Config is the whole file.
type Config struct {
	Scheduler Scheduler `toml:"scheduler"`
	MPS       MPS       `toml:"mps"`
	Metrics   Metrics   `toml:"metrics"`
	Tenants   Tenants   `toml:"tenants"`
}

// Tenants is the host's policy for tenants: what happens to one that asked for DetShare and cannot get it, and the
// ceilings on what a tenant may claim for itself (docs/threat-model-quota.md). The container components (shim, runc
// wrapper, hook) and `detshare run` read it too, not only the scheduler. A tenant writes its weight and tier in
// labels, annotations or flags it controls; above the ceilings only the host's consent counts: the tenant's ID
// matching a pattern of Trusted.
type Tenants struct {
	// FailOpen: a tenant whose quota names any DetShare key (tier, SMs, memory, …) but cannot get DetShare (table
	// or run directory full, library missing, no GPU, no scheduler) runs unshared with a warning on its stderr and
	// a count in detshare_fail_open_total, instead of being refused (the default).
	FailOpen  bool     `toml:"fail_open"`
	MaxWeight uint32   `toml:"max_weight"` // weight used for a tenant asking for more (1..10000)
	MaxTier   string   `toml:"max_tier"`   // best-effort | burstable | latency-critical
	Trusted   []string `toml:"trusted"`    // tenant IDs (path.Match globs) allowed above the ceilings
	// DemandWindow: a tenant whose page says it has queued work counts as busy only while the counters the library
	// increments (launches, busy time, queued work) moved within this window.
	DemandWindow Duration `toml:"demand_window"`
	// PageMounts (PageMountsAuto, On or Off): whether each client page registered while the scheduler leads lives
	// on a tmpfs of its own, the page's size, so that a tenant writing past its page's end is refused by the kernel
	// (ENOSPC) instead of filling the run directory's filesystem until the next housekeeping round (issue 27). auto:
	// on for the default run directory (/run/detshare, on the host's /run), off for any other. Needs registrars
	// that may mount (root); see PageMountsFor.
	PageMounts string `toml:"page_mounts"`
	// MemoryOutside (MemoryOutsideKill or Report): what the scheduler does when the device memory NVML reports for
	// a tenant's processes exceeds its memory quota plus the driver's context memory per process
	// (view.ContextAllowance), i.e. when it allocated past the library (issue 27). kill: its largest such process is
	// killed, one per housekeeping round, as a cgroup's OOM killer would; report: status, top and metrics only.
	MemoryOutside string `toml:"memory_outside"`
}

// Values of tenants.memory_outside.
const (
	MemoryOutsideKill   = "kill"
	MemoryOutsideReport = "report"
)

// Values of tenants.page_mounts.
const (
	PageMountsAuto = "auto"
	PageMountsOn   = "on"
	PageMountsOff  = "off"
)

// PageMountsFor tells whether client pages of runDir get a tmpfs of their own (tenants.page_mounts, validated).
func (t Tenants) PageMountsFor(runDir string) bool {
	switch t.PageMounts {
	case PageMountsOn:
		return true
	case PageMountsOff:
		return false
	}
	return table.PageMountsByDefault(runDir)
}

// Trusts reports whether the host consented to tenant id going above the ceilings.
func (t Tenants) Trusts(id string) bool {
	for _, p := range t.Trusted {
		if ok, err := path.Match(p, id); err == nil && ok {
			return true
		}
	}
	return false
}

// Scheduler holds the policy and the loop's timings.
type Scheduler struct {
	Policy      string   `toml:"policy"`       // throughput-oriented | tpot-first
	DecodeBoost uint32   `toml:"decode_boost"` // TPOT-First weight multiplier for decode tenants
	Quantum     Duration `toml:"quantum"`      // temporal quantum of a best-effort tenant of weight 1
	MaxQuantum  Duration `toml:"max_quantum"`
	Tick        Duration `toml:"tick"`        // longest sleep between passes without doorbell (reaping, heartbeat)
	ReapEvery   Duration `toml:"reap_every"`  // how often dead processes are looked for
	LatencySLO  Duration `toml:"latency_slo"` // a latency tier waiting longer than this for its grant is an SLO violation
	// Throttling of lower tiers while a latency-critical tenant is busy (issue 12).
	BEFloor        int      `toml:"be_floor"`         // SM groups a busy best-effort/burstable tenant keeps
	GateDepth      uint32   `toml:"gate_depth"`       // kernels in flight per stream of a throttled tenant
	GateBudget     Duration `toml:"gate_budget"`      // estimated run time of those kernels
	PowerNearLimit float64  `toml:"power_near_limit"` // board power / limit above which lower tiers are throttled; 0 = off
	// LCReserve (issue 26): the fraction of a GPU's SM groups a latency-critical tenant without slo-p99 holds as an
	// exclusive partition (never less than its guarantee), its neighbours keeping the rest at full depth; also
	// where the SLO controller starts a tenant with slo-p99. 0: issue 12's dynamic expansion.
	LCReserve float64 `toml:"lc_reserve"`
	// LCOverlap (issue 26): a sized latency-critical tenant also runs on its neighbours' groups (its partition
	// stays exclusive; the rest is shared under MPS, its client priority above theirs), as MPS with a thread
	// percentage lets it, while the neighbours keep their groups and never flip.
	LCOverlap bool `toml:"lc_overlap"`
	// ShareOverlap (issue 26): busy tenants share the groups nobody holds exclusively (each granted all of them,
	// interleaved by MPS) instead of splitting them by weight.
	ShareOverlap bool `toml:"share_overlap"`
	// NarrowGroups (issue 26): while a latency-critical tenant shares a GPU, the memory-bound kernels of every lower
	// tier (less than 8 KiB of shared memory: elementwise, optimizer, reduction) run on this many groups of its
	// grant, its other kernels on all of it. 0: on all of it.
	NarrowGroups int `toml:"narrow_groups"`
}

// MPS controls the per-GPU MPS control daemons.
type MPS struct {
	Enable  bool   `toml:"enable"`  // false: temporal quanta only
	Control string `toml:"control"` // nvidia-cuda-mps-control executable (name looked up in PATH, or a path)
	// Exclusive puts every GPU in EXCLUSIVE_PROCESS compute mode while the scheduler runs (restored when it stops),
	// so that a process which leaves MPS (CUDA_MPS_PIPE_DIRECTORY unset or changed) cannot create a context on it.
	Exclusive bool `toml:"exclusive"`
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Listen string `toml:"listen"` // host:port, empty = off
}

// Duration is a time.Duration written as "5ms" in TOML.
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (examples: 500us, 5ms, 1s)", string(b))
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// DefaultLCReserve is scheduler.lc_reserve's default: half the GPU (BENCHMARKS.md, issue 26, has its trade-off).
const DefaultLCReserve = 0.5

// DefaultNarrowGroups is scheduler.narrow_groups' default: two 8-SM groups of an H100 for memory-bound kernels
// (BENCHMARKS.md, issue 26, "The neighbour's optimizer, not its GEMMs, slows the LC").
const DefaultNarrowGroups = 2

// Policies are the values of scheduler.policy, sched/policy's kinds (sched/daemon's TestPolicyOptions checks that
// they are the same).
var Policies = []string{"throughput-oriented", "tpot-first"}

// Default returns the built-in defaults (what the example file documents). The scheduler section's are
// sched/policy.DefaultOptions (sched/daemon's TestPolicyOptions checks that they are the same).
func Default() Config {
	return Config{
		Scheduler: Scheduler{Policy: Policies[0], DecodeBoost: 3, Quantum: Duration{5 * time.Millisecond},
			MaxQuantum: Duration{50 * time.Millisecond}, Tick: Duration{100 * time.Millisecond},
			ReapEvery: Duration{250 * time.Millisecond}, LatencySLO: Duration{time.Millisecond},
			BEFloor: 1, GateDepth: 8, GateBudget: Duration{500 * time.Microsecond}, PowerNearLimit: 0.92,
			LCReserve: DefaultLCReserve, LCOverlap: true, NarrowGroups: DefaultNarrowGroups},
		MPS:     MPS{Enable: true, Control: "nvidia-cuda-mps-control"},
		Metrics: Metrics{Listen: ""},
		Tenants: Tenants{MaxWeight: 100, MaxTier: "latency-critical", Trusted: []string{}, DemandWindow: Duration{2 * time.Second},
			PageMounts: PageMountsAuto, MemoryOutside: MemoryOutsideKill},
	}
}

// Load reads path over the defaults. A missing file gives the defaults.
func Load(path string) (Config, error) {
	c := Default()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes a file's content over the defaults and validates it.
func Parse(name string, data []byte) (Config, error) {
	c := Default()
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return Config{}, fmt.Errorf("config %s: unknown key %q (allowed: scheduler.{policy,decode_boost,quantum,max_quantum,tick,reap_every,latency_slo,be_floor,gate_depth,gate_budget,power_near_limit,lc_reserve,lc_overlap,share_overlap,narrow_groups}, mps.{enable,control,exclusive}, metrics.listen, tenants.{fail_open,max_weight,max_tier,trusted,demand_window,page_mounts,memory_outside})", name, und[0].String())
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", name, err)
	}
	return c, nil
}

// Validate checks ranges.
func (c Config) Validate() error {
	if !slices.Contains(Policies, c.Scheduler.Policy) {
		q := make([]string, len(Policies))
		for i, p := range Policies {
			q[i] = strconv.Quote(p)
		}
		return fmt.Errorf("scheduler.policy: policy %q: allowed values are %s", c.Scheduler.Policy, strings.Join(q, ", "))
	}
	if c.Scheduler.DecodeBoost < 1 || c.Scheduler.DecodeBoost > 100 {
		return fmt.Errorf("scheduler.decode_boost = %d: allowed values are 1..100", c.Scheduler.DecodeBoost)
	}
	for _, d := range []struct {
		key    string
		v      time.Duration
		lo, hi time.Duration
	}{
		{"scheduler.quantum", c.Scheduler.Quantum.Duration, 100 * time.Microsecond, 10 * time.Second},
		{"scheduler.max_quantum", c.Scheduler.MaxQuantum.Duration, 100 * time.Microsecond, 10 * time.Second},
		{"scheduler.tick", c.Scheduler.Tick.Duration, time.Millisecond, 10 * time.Second},
		{"scheduler.reap_every", c.Scheduler.ReapEvery.Duration, 10 * time.Millisecond, time.Second},
		{"scheduler.latency_slo", c.Scheduler.LatencySLO.Duration, time.Microsecond, time.Minute},
		{"tenants.demand_window", c.Tenants.DemandWindow.Duration, 100 * time.Millisecond, time.Minute},
		{"scheduler.gate_budget", c.Scheduler.GateBudget.Duration, 10 * time.Microsecond, time.Second},
	} {
		if d.v < d.lo || d.v > d.hi {
			return fmt.Errorf("%s = %s: allowed values are %s..%s", d.key, d.v, d.lo, d.hi)
		}
	}
	if c.Scheduler.NarrowGroups < 0 || c.Scheduler.NarrowGroups > 63 {
		return fmt.Errorf("scheduler.narrow_groups = %d: allowed values are 0 (off) .. 63 SM groups", c.Scheduler.NarrowGroups)
	}
	if c.Scheduler.MaxQuantum.Duration < c.Scheduler.Quantum.Duration {
		return fmt.Errorf("scheduler.max_quantum = %s: must be >= scheduler.quantum (%s)", c.Scheduler.MaxQuantum, c.Scheduler.Quantum)
	}
	if c.Tenants.MaxWeight < 1 || c.Tenants.MaxWeight > 10000 {
		return fmt.Errorf("tenants.max_weight = %d: allowed values are 1..10000", c.Tenants.MaxWeight)
	}
	if _, err := table.ParseTier(c.Tenants.MaxTier); err != nil {
		return fmt.Errorf("tenants.max_tier = %w", err)
	}
	switch c.Tenants.MemoryOutside {
	case MemoryOutsideKill, MemoryOutsideReport:
	default:
		return fmt.Errorf("tenants.memory_outside = %q: allowed values are %q (kill the largest process of a tenant "+
			"over its memory quota past the library) and %q (show it only)", c.Tenants.MemoryOutside,
			MemoryOutsideKill, MemoryOutsideReport)
	}
	switch c.Tenants.PageMounts {
	case PageMountsAuto, PageMountsOn, PageMountsOff:
	default:
		return fmt.Errorf("tenants.page_mounts = %q: allowed values are %q, %q, %q", c.Tenants.PageMounts,
			PageMountsAuto, PageMountsOn, PageMountsOff)
	}
	for _, p := range c.Tenants.Trusted {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return fmt.Errorf("tenants.trusted: %q is not a pattern (shell glob of tenant IDs, e.g. \"prod-*\")", p)
		}
	}
	if c.Scheduler.BEFloor < 0 || c.Scheduler.BEFloor > 64 {
		return fmt.Errorf("scheduler.be_floor = %d: allowed values are 0..64 (SM groups; 0 pauses lower tiers while a latency-critical tenant is busy)", c.Scheduler.BEFloor)
	}
	if a := c.Scheduler.LCReserve; a < 0 || a > 1 {
		return fmt.Errorf("scheduler.lc_reserve = %v: allowed values are 0 (dynamic expansion) to 1 (fraction of the GPU's SM groups a latency-critical tenant without slo-p99 holds)", a)
	}
	if c.Scheduler.GateDepth < 1 || c.Scheduler.GateDepth > 1024 {
		return fmt.Errorf("scheduler.gate_depth = %d: allowed values are 1..1024 (kernels)", c.Scheduler.GateDepth)
	}
	if p := c.Scheduler.PowerNearLimit; p != 0 && (p < 0.5 || p > 1) {
		return fmt.Errorf("scheduler.power_near_limit = %v: allowed values are 0 (off) or 0.5..1 (fraction of the board's power limit)", p)
	}
	if c.MPS.Enable && c.MPS.Control == "" {
		return errors.New(`mps.control = "": name the nvidia-cuda-mps-control executable, or set mps.enable = false`)
	}
	if c.MPS.Exclusive && !c.MPS.Enable {
		return errors.New("mps.exclusive = true needs mps.enable = true (in EXCLUSIVE_PROCESS mode only the MPS " +
			"server may hold a context: without MPS one tenant process at a time could use the GPU)")
	}
	return nil
}

// PolicyOptions are the scheduler section's settings of the grant policy, as plain values: sched/daemon converts
// them to sched/policy.Options field by field.
type PolicyOptions struct {
	Kind         string // one of Policies
	DecodeBoost  uint32
	Quantum      time.Duration
	MaxQuantum   time.Duration
	Floor        int // scheduler.be_floor
	GateDepth    uint32
	GateBudget   time.Duration
	LCReserve    float64 // scheduler.lc_reserve
	LCOverlap    bool    // scheduler.lc_overlap
	ShareOverlap bool    // scheduler.share_overlap
	NarrowGroups int     // scheduler.narrow_groups
}

// PolicyOptions returns the scheduler section's policy settings.
func (c Config) PolicyOptions() PolicyOptions {
	return PolicyOptions{Kind: c.Scheduler.Policy, DecodeBoost: c.Scheduler.DecodeBoost, Quantum: c.Scheduler.Quantum.Duration,
		MaxQuantum: c.Scheduler.MaxQuantum.Duration, Floor: c.Scheduler.BEFloor, GateDepth: c.Scheduler.GateDepth,
		GateBudget: c.Scheduler.GateBudget.Duration, LCReserve: c.Scheduler.LCReserve, LCOverlap: c.Scheduler.LCOverlap,
		ShareOverlap: c.Scheduler.ShareOverlap, NarrowGroups: c.Scheduler.NarrowGroups}
}
