/*
 * weir's C glue to SPDK: the few calls whose arguments are SPDK structs that
 * change with SPDK's version (the environment's options, a transport id, a
 * namespace's identify data). Compiled against the installed SPDK's headers, so
 * their layout is always the one SPDK was built with; the Rust side calls
 * these and, for the I/O path, SPDK's functions that take only handles and
 * scalars. Written against SPDK 24.09 or later (spdk_env_opts.opts_size).
 *
 * In the tests, the same file is compiled against the stand-in's headers
 * (csrc/mock/include), which declare the fields used here and nothing more.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "spdk/env.h"
#include "spdk/nvme.h"

/* Capability bits of weir_spdk_ns_caps, as src/ffi.rs reads them. */
#define WEIR_CAP_WRITE_ZEROES 0x2u
#define WEIR_CAP_FLUSH 0x4u
#define WEIR_CAP_WRITE_ZEROES_DEALLOCATE 0x10u

/*
 * Initialise SPDK's environment (hugepage memory, PCI access) for this
 * process. core_mask NULL: SPDK's default; mem_size_mb 0: SPDK's default.
 * Returns 0 or a negative errno.
 *
 * DPDK pins the thread that initialises it to its main core; every thread it
 * starts later would inherit that. The caller's affinity is put back after,
 * as SPDK's own fio plugin and perf tool do.
 */
int weir_spdk_env_init(const char *name, const char *core_mask, int mem_size_mb,
		       bool no_huge, bool no_pci)
{
	struct spdk_env_opts opts;
	cpu_set_t saved;
	int have_saved = sched_getaffinity(0, sizeof(saved), &saved) == 0;
	int rc;

	memset(&opts, 0, sizeof(opts));
	opts.opts_size = sizeof(opts);
	spdk_env_opts_init(&opts);
	opts.name = name;
	if (core_mask != NULL) {
		opts.core_mask = core_mask;
	}
	if (mem_size_mb > 0) {
		opts.mem_size = mem_size_mb;
	}
	opts.no_huge = no_huge;
	opts.no_pci = no_pci;
	rc = spdk_env_init(&opts);
	if (have_saved) {
		(void)sched_setaffinity(0, sizeof(saved), &saved);
	}
	return rc;
}

/*
 * Attach the controller a transport id names ("trtype:PCIe
 * traddr:0000:01:00.0", as SPDK parses it), with SPDK's default controller
 * options. On failure returns NULL and sets *err to a negative errno.
 */
struct spdk_nvme_ctrlr *weir_spdk_connect(const char *trid_str, int *err)
{
	struct spdk_nvme_transport_id trid;
	struct spdk_nvme_ctrlr *ctrlr;
	int rc;

	memset(&trid, 0, sizeof(trid));
	rc = spdk_nvme_transport_id_parse(&trid, trid_str);
	if (rc != 0) {
		*err = rc < 0 ? rc : -EINVAL;
		return NULL;
	}
	ctrlr = spdk_nvme_connect(&trid, NULL, 0);
	if (ctrlr == NULL) {
		*err = -ENODEV;
	}
	return ctrlr;
}

/* An identify string field (ASCII, space padded) with the padding dropped. */
static size_t trimmed(const int8_t *field, size_t len)
{
	while (len > 0 && (field[len - 1] == ' ' || field[len - 1] == '\0')) {
		len--;
	}
	return len;
}

/*
 * A name for the namespace that changes when the SSD or the namespace does:
 * the controller's model and serial number, and the namespace's id, NGUID and
 * EUI-64 (a namespace deleted and made again gets new ones). Into out,
 * NUL-terminated.
 */
void weir_spdk_identity(struct spdk_nvme_ctrlr *ctrlr, struct spdk_nvme_ns *ns, uint32_t nsid,
			char *out, size_t cap)
{
	const struct spdk_nvme_ctrlr_data *c = spdk_nvme_ctrlr_get_data(ctrlr);
	const struct spdk_nvme_ns_data *d = spdk_nvme_ns_get_data(ns);
	char nguid[33];

	for (size_t i = 0; i < sizeof(d->nguid); i++) {
		snprintf(&nguid[2 * i], 3, "%02x", d->nguid[i]);
	}
	snprintf(out, cap, "nvme %.*s %.*s ns %" PRIu32 " nguid %s eui64 %016" PRIx64,
		 (int)trimmed(c->mn, sizeof(c->mn)), (const char *)c->mn,
		 (int)trimmed(c->sn, sizeof(c->sn)), (const char *)c->sn, nsid, nguid, d->eui64);
}

/* What the namespace can do, as WEIR_CAP_* bits. */
uint32_t weir_spdk_ns_caps(struct spdk_nvme_ns *ns)
{
	uint32_t flags = spdk_nvme_ns_get_flags(ns);
	const struct spdk_nvme_ns_data *data = spdk_nvme_ns_get_data(ns);
	uint32_t caps = 0;

	if (flags & SPDK_NVME_NS_WRITE_ZEROES_SUPPORTED) {
		caps |= WEIR_CAP_WRITE_ZEROES;
	}
	if (flags & SPDK_NVME_NS_FLUSH_SUPPORTED) {
		caps |= WEIR_CAP_FLUSH;
	}
	/* DLFEAT: Write Zeroes may deallocate (DEAC) as it zeroes. */
	if (data != NULL && data->dlfeat.bits.write_zero_deallocate) {
		caps |= WEIR_CAP_WRITE_ZEROES_DEALLOCATE;
	}
	return caps;
}
