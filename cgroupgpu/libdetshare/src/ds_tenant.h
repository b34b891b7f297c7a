/*
 * ds_tenant.h — loading the tenant (ds_tenant.c): the quota file, the table and the client page.
 */
#ifndef DETSHARE_LIBDETSHARE_DS_TENANT_H
#define DETSHARE_LIBDETSHARE_DS_TENANT_H

/* Sets ds_process.tenant when this process belongs to a tenant whose files are all usable; otherwise leaves it NULL
 * (pure pass-through) and says why in the log. Constructor only (ds_init.c): before any hook can run. */
void ds_tenant_load(void);

#endif /* DETSHARE_LIBDETSHARE_DS_TENANT_H */
