/*
 * ds_init.c — what runs when libdetshare is loaded: the constructor (settings, the tenant, the fork and exit
 * handlers) and the fork handler, which alone knows every lock of the library. Nothing calls into this file; it
 * calls the parts it starts (ds_process.c, ds_tenant.c), connects the demand monitor to the streams it watches
 * (ds_demand_init), and calls each part's fork functions.
 */
#include "ds_demand.h"
#include "ds_driver.h"
#include "ds_graph.h"
#include "ds_guard.h"
#include "ds_ledger.h"
#include "ds_mem.h"
#include "ds_pool.h"
#include "ds_process.h"
#include "ds_streams.h"
#include "ds_tenant.h"

#include <stdlib.h>

/* ---------------------------------------------------------------------------------------------------------------
 * fork: the child starts with no process entry (it claims its own at its first driver use, with mem_used 0) and
 * with an empty allocation table (the parent's allocations are the parent's).
 *
 * Lock order. Before fork the one handler takes every lock of the library, so that no lock is copied into the child
 * held by a thread that does not exist there and no state is copied half-changed. It takes them in the order in
 * which the library nests them (outer first), so it cannot deadlock with a thread that holds some of them:
 *   1. g_glock (ds_graph.c)       held while a graph copy is made, which may ask for a private stream (4)
 *   2. every logical stream's lock, then its gate's lock (ds_streams.c, in registration order; never nested with
 *      each other; relearn takes 3 under a stream's lock)
 *   3. g_reg_lock (ds_streams.c)  registration of logical streams
 *   4. g_pool_lock (ds_pool.c)    green contexts and the grant's choice of one (ds_grant.c); takes 5 and 6 inside
 *   5. g_mk_lock (ds_pool.c)      the green-context thread's queue
 *   6. g_snap_lock (ds_guard.c)   the table snapshot
 *   7. g_attach_lock (ds_process.c) this process's ds_proc entry
 *   8. g_lock (ds_ledger.c)       this process's share of the memory ledger; taken by charges, never around another
 *   9. the allocation-table locks (ds_mem.c), in index order; leaves
 * The parent releases them in the reverse order; the child releases them too (it is single-threaded) and resets
 * what belonged to threads it does not have. pthread_once guards (driver, NVML, monitor start) are not locks held
 * across library code and are not taken here.
 * ------------------------------------------------------------------------------------------------------------- */
static void atfork_prepare(void) {
    ds_graph_fork_lock();
    ds_streams_fork_lock();
    ds_pool_fork_lock();
    ds_guard_fork_lock();
    ds_process_fork_lock();
    ds_ledger_fork_lock();
    ds_track_lock_all();
}
static void atfork_parent(void) {
    ds_track_unlock_all();
    ds_ledger_fork_unlock();
    ds_process_fork_unlock();
    ds_guard_fork_unlock();
    ds_pool_fork_unlock();
    ds_streams_fork_unlock();
    ds_graph_fork_unlock();
}
static void atfork_child(void) {
    ds_track_unlock_all();
    ds_track_reset_child();
    ds_ledger_child();
    ds_process_child();
    ds_guard_fork_unlock();
    ds_pool_child();
    ds_streams_child();
    ds_demand_child();
    ds_graph_fork_unlock();
}

static void on_exit_release(void) {
    atomic_store(&ds_process.exiting, 1);
    ds_detach();
}

__attribute__((constructor(101))) static void ds_constructor(void) {
    ds_settings_init();
    ds_dlsym_init();
    ds_demand_init(ds_streams_drained);
    ds_tenant_load();
    if (ds_process.tenant) {
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        atexit(on_exit_release);
    }
}
