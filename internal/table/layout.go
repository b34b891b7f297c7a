package table

// The Go mirror of detshare_table.h. Every struct here has exactly the size and field offsets of its C
// counterpart; abi_test.go compiles a C program against the header and fails when they differ. The `c` tags name
// the C field each Go field mirrors (the test uses them). Fields read concurrently are accessed with sync/atomic.

// Constants from detshare_table.h.
const (
	TableMagic    uint64 = 0x3142415448534544 // DS_TABLE_MAGIC "DESHTAB1"
	ClientMagic   uint64 = 0x31544e4c43534544 // DS_CLIENT_MAGIC "DESCLNT1"
	DoorbellMagic uint64 = 0x314c4542524f4444 // DS_DOORBELL_MAGIC "DDORBEL1"

	MaxGPUs       = 16  // DS_MAX_GPUS
	MaxContainers = 256 // DS_MAX_CONTAINERS
	MaxSMGroups   = 64  // DS_MAX_SM_GROUPS
	MaxProcs      = 64  // DS_MAX_PROCS
	IDLen         = 128 // DS_ID_LEN, including the terminating NUL
	// The fine completion-latency histogram of a client page (DS_LAT_FINE_*): LatFineSub buckets per octave from
	// 2^LatFineMinOct microseconds.
	LatFineBuckets = 64 // DS_LAT_FINE_BUCKETS
	LatFineSub     = 8  // DS_LAT_FINE_SUB
	LatFineMinOct  = 6  // DS_LAT_FINE_MIN_OCT

	// Container.SLOState bits (DS_SLO_*).
	SLOActive     = 1 // the controller has stepped at least once
	SLOMiss       = 2 // the last window was above the SLO
	SLOInfeasible = 4 // missed at the most protective share
	SLOHolding    = 8 // not attainable: holding the largest share within 10 % of the floor

	GPUsOffset       = 4096                                 // DS_GPUS_OFFSET
	ContainersOffset = GPUsOffset + MaxGPUs*1024            // DS_CONTAINERS_OFFSET
	TableSize        = ContainersOffset + MaxContainers*512 // DS_TABLE_SIZE
)

// Header.State values.
const (
	TableInitialising uint32 = 0
	TableReady        uint32 = 1
)

// GPU.State values.
const (
	GPUAbsent  uint32 = 0
	GPUPresent uint32 = 1
)

// GPU.SplitState values.
const (
	SplitUnknown    uint32 = 0
	SplitPublishing uint32 = 1
	SplitPublished  uint32 = 2
)

// GPU.MPSState values.
const (
	MPSUnknown uint32 = 0
	MPSAbsent  uint32 = 1
	MPSRunning uint32 = 2
	MPSFailed  uint32 = 3
)

// Mode values (GPU.Mode and Container.GrantMode).
const (
	ModeNone         uint32 = 0
	ModeSpatial      uint32 = 1
	ModeTemporal     uint32 = 2
	ModeUnrestricted uint32 = 3
)

// Container.State values.
const (
	SlotFree     uint32 = 0
	SlotReserved uint32 = 1
	SlotActive   uint32 = 2
	SlotDraining uint32 = 3
)

// Container.Tier values.
const (
	TierBestEffort      Tier = 0
	TierBurstable       Tier = 1
	TierLatencyCritical Tier = 2
)

// Container.Role values.
const (
	RoleNone    Role = 0
	RolePrefill Role = 1
	RoleDecode  Role = 2
)

// Container.Flags bits.
const (
	FlagLend       uint32 = 1 << 0 // DS_CF_LEND
	FlagHostTenant uint32 = 1 << 1 // DS_CF_HOST_TENANT
	FlagPinned     uint32 = 1 << 3 // DS_CF_PINNED
)

// Proc.State values.
const (
	ProcFree     uint32 = 0
	ProcClaiming uint32 = 1
	ProcLive     uint32 = 2
	ProcReaping  uint32 = 3
)

// Header is struct ds_table_header (4096 bytes at offset 0 of the table).
type Header struct {
	Magic              uint64     `c:"magic"`
	ABIVersion         uint32     `c:"abi_version"`
	HeaderSize         uint32     `c:"header_size"`
	TableSize          uint64     `c:"table_size"`
	MaxGPUs            uint32     `c:"max_gpus"`
	MaxContainers      uint32     `c:"max_containers"`
	GPUEntrySize       uint32     `c:"gpu_entry_size"`
	ContainerEntrySize uint32     `c:"container_entry_size"`
	GPUsOffset         uint64     `c:"gpus_offset"`
	ContainersOffset   uint64     `c:"containers_offset"`
	CreatedNs          uint64     `c:"created_ns"`
	Generation         uint64     `c:"generation"`
	NGPUs              uint32     `c:"n_gpus"`
	State              uint32     `c:"state"`
	SchedPID           uint64     `c:"sched_pid"`
	SchedStartTime     uint64     `c:"sched_start_time"`
	SchedHeartbeatNs   uint64     `c:"sched_heartbeat_ns"`
	SchedEpoch         uint64     `c:"sched_epoch"`
	Policy             uint32     `c:"policy"`
	Flags              uint32     `c:"flags"`
	Reserved           [3976]byte `c:"reserved"`
}

// GPU is struct ds_gpu (1024 bytes each, MaxGPUs of them at GPUsOffset).
type GPU struct {
	State           uint32              `c:"state"`
	Index           uint32              `c:"index"`
	UUID            [64]byte            `c:"uuid"`
	Name            [64]byte            `c:"name"`
	MemTotal        uint64              `c:"mem_total"`
	SMCount         uint32              `c:"sm_count"`
	SplitState      uint32              `c:"split_state"`
	SplitMinSize    uint32              `c:"split_min_size"`
	SplitAlignment  uint32              `c:"split_alignment"`
	NGroups         uint32              `c:"n_groups"`
	RemainderSMs    uint32              `c:"remainder_sms"`
	GroupSMs        [MaxSMGroups]uint32 `c:"group_sms"`
	MPSState        uint32              `c:"mps_state"`
	Mode            uint32              `c:"mode"`
	MPSPipeDir      [128]byte           `c:"mps_pipe_dir"`
	TokenSeq        uint32              `c:"token_seq"`
	TokenHolder     uint32              `c:"token_holder"`
	TokenHolderGen  uint32              `c:"token_holder_gen"`
	Pad0            uint32              `c:"pad0"`
	TokenDeadlineNs uint64              `c:"token_deadline_ns"`
	GrantChanges    uint64              `c:"grant_changes"`
	// What the GPU's tenants load it with, published by the scheduler's reaper (PublishPressure) for placement.
	PressureComputePPM uint64    `c:"pressure_compute_ppm"` // sum of the tenants' busy fractions, millionths
	PressureMemBytes   uint64    `c:"pressure_mem_bytes"`   // sum of the device memory they hold
	PressureNs         uint64    `c:"pressure_ns"`          // CLOCK_REALTIME when published; 0: never
	Reserved           [408]byte `c:"reserved"`
}

// Container is struct ds_container (512 bytes each, MaxContainers of them at ContainersOffset).
type Container struct {
	State        uint32      `c:"state"`
	Gen          uint32      `c:"gen"`
	ID           [IDLen]byte `c:"id"`
	Tier         uint32      `c:"tier"`
	Role         uint32      `c:"role"`
	GPU          int32       `c:"gpu"`
	Weight       uint32      `c:"weight"`
	SMGroupsReq  uint32      `c:"sm_groups_req"`
	SMReq        uint32      `c:"sm_req"`
	MemLimit     uint64      `c:"mem_limit"`
	RegisteredNs uint64      `c:"registered_ns"`
	OwnerPID     uint64      `c:"owner_pid"`
	OwnerStart   uint64      `c:"owner_start"`
	Flags        uint32      `c:"flags"`
	Pad0         uint32      `c:"pad0"`
	GrantSeq     uint32      `c:"grant_seq"`
	GrantEpoch   uint32      `c:"grant_epoch"`
	GrantGroups  uint64      `c:"grant_groups"`
	GrantSMs     uint32      `c:"grant_sms"`
	GrantMode    uint32      `c:"grant_mode"`
	GrantNs      uint64      `c:"grant_ns"`
	DemandSeenNs uint64      `c:"demand_seen_ns"`
	Reserved     [240]byte   `c:"reserved"`
	SLOP99Us     uint32      `c:"slo_p99_us"`
	GateDepth    uint32      `c:"gate_depth"`
	GateBudgetUs uint32      `c:"gate_budget_us"`
	NarrowGroups uint32      `c:"narrow_groups"`
	SLOGivenBack uint32      `c:"slo_given_back"`
	SLOState     uint32      `c:"slo_state"`
	SLOWindowUs  uint32      `c:"slo_window_p99_us"`
	SLOFloorUs   uint32      `c:"slo_floor_us"`
}

// Proc is struct ds_proc (128 bytes; MaxProcs of them in each client page).
type Proc struct {
	State       uint32   `c:"state"`
	NSPid       uint32   `c:"nspid"`
	PidNSIno    uint64   `c:"pidns_ino"`
	StartTime   uint64   `c:"start_time"`
	HostPID     uint64   `c:"host_pid"`
	HeartbeatNs uint64   `c:"heartbeat_ns"`
	MemUsed     uint64   `c:"mem_used"`
	Launches    uint64   `c:"launches"`
	BusyNs      uint64   `c:"busy_ns"`
	Queued      uint64   `c:"queued"`
	Busy        uint32   `c:"busy"`
	Pad0        uint32   `c:"pad0"`
	Reserved    [48]byte `c:"reserved"`
}

// ClientPage is struct ds_client_page (one file per tenant: clients/<id>.page).
type ClientPage struct {
	Magic           uint64                 `c:"magic"`
	ABIVersion      uint32                 `c:"abi_version"`
	Slot            uint32                 `c:"slot"`
	SlotGen         uint32                 `c:"slot_gen"`
	MaxProcs        uint32                 `c:"max_procs"`
	ID              [IDLen]byte            `c:"id"`
	MemUsed         uint64                 `c:"mem_used"`
	MemPeak         uint64                 `c:"mem_peak"`
	OOMRefusals     uint64                 `c:"oom_refusals"`
	Launches        uint64                 `c:"launches"`
	Demand          uint32                 `c:"demand"`
	DemandSeq       uint32                 `c:"demand_seq"`
	DemandSinceNs   uint64                 `c:"demand_since_ns"`
	BusyNs          uint64                 `c:"busy_ns"`
	QueueDelayNs    uint64                 `c:"queue_delay_ns"`
	QueueDelayMaxNs uint64                 `c:"queue_delay_max_ns"`
	LatFine         [LatFineBuckets]uint64 `c:"lat_fine"`
	LatCount        uint64                 `c:"lat_count"`
	LatSumNs        uint64                 `c:"lat_sum_ns"`
	GateWaits       uint64                 `c:"gate_waits"`
	GateWaitNs      uint64                 `c:"gate_wait_ns"`
	LatHist         [32]uint64             `c:"lat_hist"`
	Procs           [MaxProcs]Proc         `c:"procs"`
}

// Doorbell is struct ds_doorbell (the doorbell file, one page).
type Doorbell struct {
	Magic    uint64     `c:"magic"`
	Seq      uint32     `c:"seq"`
	Pad0     uint32     `c:"pad0"`
	Reserved [4080]byte `c:"reserved"`
}

// Sizes of the mirrored structs, as the header's _Static_asserts fix them.
const (
	HeaderSize     = 4096
	GPUSize        = 1024
	ContainerSize  = 512
	ProcSize       = 128
	ClientPageSize = 1024 + ProcSize*MaxProcs
	DoorbellSize   = 4096
)

// cString returns the NUL-terminated string held in b.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// cStringIs tells whether the NUL-terminated string in b is s, without copying it.
func cStringIs(b []byte, s string) bool {
	if len(s) >= len(b) || b[len(s)] != 0 {
		return len(s) == len(b) && string(b) == s
	}
	return string(b[:len(s)]) == s
}

// putCString stores s NUL-terminated in b (truncating; callers validate lengths first).
func putCString(b []byte, s string) {
	for i := range b {
		b[i] = 0
	}
	n := copy(b[:len(b)-1], s)
	_ = n
}
