/*
 * ds_ledger.h — the tenant-wide memory ledger the tenant cannot rewrite (ds_ledger.c): what every process of the
 * tenant holds through the library, kept by the kernel as locks on the client page, so that zeroing mem_used in the
 * page does not let N processes hold N x the quota (issue 27).
 */
#ifndef DETSHARE_LIBDETSHARE_DS_LEDGER_H
#define DETSHARE_LIBDETSHARE_DS_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

/* Makes this process's share of the ledger cover `held` bytes (what it holds through the library, private tally)
 * against the tenant's `limit` (0: unlimited, nothing is kept). Growing may fail: false, and nothing changed.
 * Shrinking always succeeds. */
bool ds_ledger_cover(uint64_t held, uint64_t limit);
void ds_ledger_open(uint64_t limit); /* the constructor, once the tenant is published (ds_tenant.c) */
void ds_ledger_fork_lock(void); /* fork handler (ds_init.c, "Lock order") */
void ds_ledger_fork_unlock(void);
void ds_ledger_child(void); /* in the child: it holds nothing of the parent's share */

#endif /* DETSHARE_LIBDETSHARE_DS_LEDGER_H */
