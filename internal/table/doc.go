// Package table is the Go side of DetShare's host-wide shared-memory table. The binary layout is defined once, in
// detshare_table.h; this package mirrors it (layout.go) and its tests fail when the two disagree.
//
// Files live under the run directory (DefaultRunDir, or DETSHARE_RUN_DIR / --run-dir; see Paths):
// the table (root writes, everyone maps read-only), table.lock (flock for registration), the doorbell (every tenant
// may ring it) and one client page per tenant.
//
// Who writes what:
//   - Registration (Table.Register / Table.Deregister, used only through cgroupgpu/tenant) writes container identity
//     and quota, under flock(table.lock). A slot goes FREE -> RESERVED -> ACTIVE; because only the lock holder ever
//     reserves, any RESERVED or DRAINING slot seen while holding the lock belongs to a registrar that died, and is
//     rolled back (or its deregistration completed) on the spot. kill -9 at any point leaves a usable table.
//   - The scheduler leader is the only writer of grants (PublishGrant, a seqlock plus an epoch futex word), GPU
//     splits/mode/MPS state and temporal tokens, and the leader/heartbeat fields (SetLeader, Heartbeat). The one
//     exception: registration resets a slot's grant when the slot changes hands; both writers take the seqlock's
//     writer side by CAS (even -> odd), and a grant left odd by a dead writer is taken over after a timeout.
//   - Each tenant's processes write only their own client page (AttachProcess, demand, statistics) and ring the
//     doorbell.
//
// Readers on the launch fast path (GrantEpoch, then LoadGrant/ReadGrant when the epoch moved) do a few atomic loads: no locks, no syscalls. Blocking
// waits use futexes on the shared words with timeouts (FutexWait), never unbounded spins.
//
// Reaping: ScanProcesses/IsProcessAlive resolve a process by (PID-namespace inode, PID in that namespace, start
// time) through /proc; ReapDeadProcesses credits a dead process's memory back to its page; ReapDeadTenants removes
// host tenants (`detshare run`) whose owner died. Reaper.Pass does the whole pass with the client pages it keeps
// mapped (the scheduler runs one beside its decision loop; Table.Reap is the one-shot form); registration reaps dead
// host tenants itself only when no scheduler is alive to do it, or when one stands in its way.
//
// Grants of a reused slot: a slot's gen is bumped at every registration and its grant_epoch/grant_seq keep counting
// across generations, so a client compares ds_container.gen with its page's slot_gen before trusting a grant.
//
// The C side for libdetshare is detshare_table_client.h (header-only, static inline).
package table

// ABIVersion is DS_TABLE_ABI_VERSION from detshare_table.h.
const ABIVersion = 2
