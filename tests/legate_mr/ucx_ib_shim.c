/* LD_PRELOAD shim for multi-rank Legate over the libucx-cu12 wheel (tests/legate_mr).
 *
 * That UCX build has no InfiniBand transport, so ucp_config_modify() of an IB_* key
 * (Realm sets IB_SEG_SIZE) fails, and Realm treats the failure as fatal. This wrapper
 * passes every call on to UCX and reports success for IB_* keys that UCX rejects: there
 * is no IB transport for them to configure. Built by `make test-legate-mr` into build/.
 *
 * libucp is loaded RTLD_LOCAL (a dependency of librealm, itself dlopen'ed by a Python
 * extension), so RTLD_NEXT cannot see it: the already-loaded library is found by its
 * soname instead. H5T_UCX_SHIM_DEBUG=1 logs every call to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ucs_status_t; /* UCS_OK == 0 */
typedef ucs_status_t (*modify_fn)(void *config, const char *name, const char *value);

static modify_fn find_next(void)
{
    void *f = dlsym(RTLD_NEXT, "ucp_config_modify");
    if (!f) {
        void *h = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            f = dlsym(h, "ucp_config_modify");
    }
    return (modify_fn)f;
}

ucs_status_t ucp_config_modify(void *config, const char *name, const char *value)
{
    static modify_fn next;
    if (!next)
        next = find_next();
    if (!next) {
        fprintf(stderr, "ucx_ib_shim: libucp.so.0 is not loaded; cannot forward ucp_config_modify\n");
        return -1; /* UCS_ERR_NO_MESSAGE */
    }
    ucs_status_t st = next(config, name, value);
    if (getenv("H5T_UCX_SHIM_DEBUG"))
        fprintf(stderr, "ucx_ib_shim: ucp_config_modify(%s, %s) = %d\n", name ? name : "(null)",
                value ? value : "(null)", st);
    if (st != 0 && name != NULL && strncmp(name, "IB_", 3) == 0)
        return 0;
    return st;
}
