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
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "spdk/env.h"
#include "spdk/nvme.h"

/* Capability bits of weir_spdk_ns_caps, as src/ffi.rs reads them. */
#define WEIR_CAP_DEALLOCATE 0x1u
#define WEIR_CAP_WRITE_ZEROES 0x2u
#define WEIR_CAP_FLUSH 0x4u
#define WEIR_CAP_DEALLOCATED_READS_ZEROES 0x8u

/*
 * Initialise SPDK's environment (hugepage memory, PCI access) for this
 * process. core_mask NULL: SPDK's default; mem_size_mb 0: SPDK's default.
 * Returns 0 or a negative errno.
 */
int weir_spdk_env_init(const char *name, const char *core_mask, int mem_size_mb,
		       bool no_huge, bool no_pci)
{
	struct spdk_env_opts opts;

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
	return spdk_env_init(&opts);
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

/*
 * The controller's serial number (NVMe identify data: 20 ASCII bytes, space
 * padded) into out, NUL-terminated, trailing spaces dropped.
 */
void weir_spdk_ctrlr_serial(struct spdk_nvme_ctrlr *ctrlr, char *out, size_t cap)
{
	const struct spdk_nvme_ctrlr_data *data = spdk_nvme_ctrlr_get_data(ctrlr);
	size_t n = sizeof(data->sn) < cap - 1 ? sizeof(data->sn) : cap - 1;

	memcpy(out, data->sn, n);
	while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\0')) {
		n--;
	}
	out[n] = '\0';
}

/* What the namespace can do, as WEIR_CAP_* bits. */
uint32_t weir_spdk_ns_caps(struct spdk_nvme_ns *ns)
{
	uint32_t flags = spdk_nvme_ns_get_flags(ns);
	const struct spdk_nvme_ns_data *data = spdk_nvme_ns_get_data(ns);
	uint32_t caps = 0;

	if (flags & SPDK_NVME_NS_DEALLOCATE_SUPPORTED) {
		caps |= WEIR_CAP_DEALLOCATE;
	}
	if (flags & SPDK_NVME_NS_WRITE_ZEROES_SUPPORTED) {
		caps |= WEIR_CAP_WRITE_ZEROES;
	}
	if (flags & SPDK_NVME_NS_FLUSH_SUPPORTED) {
		caps |= WEIR_CAP_FLUSH;
	}
	/* DLFEAT read value 001b: a deallocated block reads as zeroes. */
	if (data != NULL && data->dlfeat.bits.read_value == 1) {
		caps |= WEIR_CAP_DEALLOCATED_READS_ZEROES;
	}
	return caps;
}
