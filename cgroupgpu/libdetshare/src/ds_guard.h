/*
 * ds_guard.h — truncated mappings (ds_guard.c): a SIGBUS in the table, the client page or the doorbell replaces
 * the region with private memory (the table's copy keeps this tenant's last-seen entries) and sets its bit in
 * ds_process.lost_mask; the process stays fail-static.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_GUARD_H
#define DETSHARE_LIBDETSHARE_DS_GUARD_H

#include <stddef.h>

enum { DS_REGION_TABLE, DS_REGION_PAGE, DS_REGION_DOORBELL, DS_NREGIONS };
void ds_guard_region(int kind, const void *base, size_t len);
void ds_guard_snapshot(void); /* copy this tenant's table entries (slow path: start-up and every new grant) */
void ds_guard_ring(void);     /* ring the doorbell, mapping it again first if it was lost and has been repaired */
int ds_guard_install(void);
void ds_guard_fork_lock(void); /* fork handler (ds_init.c, "Lock order") */
void ds_guard_fork_unlock(void);

#endif /* DETSHARE_LIBDETSHARE_DS_GUARD_H */
